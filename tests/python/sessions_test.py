#!/usr/bin/env python3
"""python.sessions: kvlab.Session's DataFrames equal what `kvlab export --format csv` writes
for the same run (a tiny eval_long recorded by the CLI), the kept slots replayed from the
replay log obey the cache's definition, and arrays come without copies.

Usage: sessions_test.py KVLAB_BINARY WORK_DIR   (PYTHONPATH holds build/python)"""
import os
import shutil
import subprocess
import sys
import unittest

import numpy as np
import pandas as pd

import kvlab

KVLAB = sys.argv[1] if len(sys.argv) > 1 else "build/bin/kvlab"
WORK = sys.argv[2] if len(sys.argv) > 2 else "/tmp/kvlab-python-sessions"
SEQ, CHUNK, CACHE = 256, 32, 64


def setUpModule():
    shutil.rmtree(WORK, ignore_errors=True)
    os.makedirs(WORK)
    global SESSION
    SESSION = os.path.join(WORK, "s.kvlab")
    subprocess.run([KVLAB, "eval_long", "tiny", "--data.seq_length", str(SEQ), "--data.num_samples", "2",
                    "--kv_cache.name", "h2o-default", "--kv_cache.cache_length", str(CACHE),
                    "--kv_cache.chunk_size", str(CHUNK), "--session", SESSION],
                   check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def export_csv(what):
    out = os.path.join(WORK, what + ".csv")
    subprocess.run([KVLAB, "export", SESSION, "--run", "1", "--what", what, "--format", "csv", "-o", out],
                   check=True, stdout=subprocess.DEVNULL)
    # Strings as written (no "NA" guessing); pieces may hold incomplete UTF-8, replaced as the
    # module does.
    return pd.read_csv(out, keep_default_na=False, na_values={"loss": [""]}, encoding_errors="replace", float_precision="round_trip",
                       dtype={"label": str, "name": str, "piece": str})


class ExportEquality(unittest.TestCase):
    def check_equal(self, df, csv):
        self.assertEqual(list(df.columns), list(csv.columns))
        self.assertEqual(len(df), len(csv))
        self.assertGreater(len(df), 0)
        for c in csv.columns:
            a, b = df[c], csv[c]
            if b.dtype == object:
                self.assertEqual(a.astype(str).tolist(), b.astype(str).tolist(), c)
            elif np.issubdtype(b.dtype, np.floating):
                # float32 losses export as their exact double; NaN where unscored on both sides.
                np.testing.assert_array_equal(a.to_numpy(np.float64), b.to_numpy(np.float64), err_msg=c)
            else:
                self.assertTrue((a.to_numpy().astype(np.uint64) == b.to_numpy().astype(np.uint64)).all(), c)

    def test_metrics(self):
        self.check_equal(kvlab.Session(SESSION).metrics(1), export_csv("metrics"))

    def test_spans(self):
        self.check_equal(kvlab.Session(SESSION).spans(1), export_csv("spans"))

    def test_memory(self):
        self.check_equal(kvlab.Session(SESSION).memory(1), export_csv("memory"))

    def test_tokens(self):
        df = kvlab.Session(SESSION).tokens(1)
        self.check_equal(df, export_csv("tokens"))
        self.assertEqual(len(df), 2 * (SEQ - 1))  # every input token of both samples


class SessionTables(unittest.TestCase):
    def test_runs_and_summaries(self):
        s = kvlab.Session(SESSION)
        runs = s.runs()
        self.assertEqual(runs["id"].tolist(), [1])
        self.assertEqual(runs["status"].tolist(), ["done"])
        summ = s.summaries()
        self.assertEqual(summ.loc[0, "config.kv_cache.name"], "h2o-default")
        self.assertEqual(int(summ.loc[0, "config.kv_cache.cache_length"]), CACHE)

    def test_kept_slots_follow_the_cache_definition(self):
        # After a step of n tokens at input_pos P a cache of L slots holds min(L, P + n) distinct
        # positions from [0, P + n), and (h2o) always the chunk's newest tokens once it is full.
        s = kvlab.Session(SESSION)
        steps = s.cache_steps(1).set_index("id")
        ids, kept = s.kept_slots(1, 0)
        self.assertEqual(kept.dtype, np.int32)
        self.assertEqual(kept.shape[0], len(ids))
        self.assertEqual(kept.shape[2], CACHE)
        self.assertTrue((np.diff(ids) > 0).all())  # write order
        # Two samples, each of SEQ - 1 input tokens (the last token is only a target).
        starts = [i for i, sid in enumerate(ids) if steps.loc[sid, "input_pos"] == 0]
        self.assertEqual(len(starts), 2)
        self.assertEqual(int(steps.loc[ids, "num_tokens"].sum()), 2 * (SEQ - 1))
        for i, sid in enumerate(ids):
            p, n = int(steps.loc[sid, "input_pos"]), int(steps.loc[sid, "num_tokens"])
            for row in kept[i]:
                held = row[row >= 0]
                self.assertEqual(len(held), min(CACHE, p + n))
                self.assertEqual(len(set(held.tolist())), len(held))
                self.assertTrue((held < p + n).all())

    def test_arrays_are_not_copies(self):
        s = kvlab.Session(SESSION)
        ids, kept = s.kept_slots(1, 0)
        self.assertFalse(kept.flags.owndata)  # it views the C++ vector (owned through a capsule)
        sc = s.scores(1)
        sid = int(sc[sc["has_values"] == 1]["id"].iloc[0])
        v = s.score_values(1, sid)
        self.assertFalse(v.flags.owndata)
        row = sc.set_index("id").loc[sid]
        self.assertEqual(v.shape, (row["B"], row["G"], row["T"]))
        finite = v[np.isfinite(v)]
        self.assertAlmostEqual(float(finite.min()), float(row["min"]), places=5)
        self.assertAlmostEqual(float(finite.max()), float(row["max"]), places=5)

    def test_bad_input_names_what_was_wrong(self):
        with self.assertRaisesRegex(Exception, "no-such-file"):
            kvlab.Session(os.path.join(WORK, "no-such-file.kvlab"))
        with self.assertRaisesRegex(ValueError, "99"):
            kvlab.Session(SESSION).metrics(99)


if __name__ == "__main__":
    unittest.main(argv=sys.argv[:1], verbosity=2)
