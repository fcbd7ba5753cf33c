#!/usr/bin/env python3
"""python.runs: runs from Python with the CLI's option table, through RunManager: options as
keywords or a dotted dict, progress callbacks, a KeyboardInterrupt that leaves the run
`cancelled` and the session sound (PRAGMA integrity_check), sweeps that skip cells the session
holds, and bad options refused with the CLI's message.

Usage: runs_test.py KVLAB_BINARY WORK_DIR   (PYTHONPATH holds build/python)"""
import json
import os
import shutil
import signal
import sqlite3
import sys
import unittest

import kvlab

WORK = sys.argv[2] if len(sys.argv) > 2 else "/tmp/kvlab-python-runs"
SMALL = {"data.seq_length": 256, "data.num_samples": 1, "kv_cache.chunk_size": 32}


def setUpModule():
    shutil.rmtree(WORK, ignore_errors=True)
    os.makedirs(WORK)


def integrity(path):
    con = sqlite3.connect("file:" + path + "?mode=ro", uri=True)
    try:
        return con.execute("PRAGMA integrity_check").fetchone()[0]
    finally:
        con.close()


class Runs(unittest.TestCase):
    def test_eval_long_with_options_and_progress(self):
        path = os.path.join(WORK, "eval.kvlab")
        seen = []
        r = kvlab.eval_long("tiny", session=path, progress=lambda run, d, t, w: seen.append((run, d, t)),
                            options={"kv_cache.name": "h2o-default"}, kv_cache__cache_length=64, **SMALL)
        self.assertEqual(r["status"], "done", r["message"])
        self.assertTrue(seen, "no progress reported")
        self.assertTrue(all(run == r["run"] for run, _, _ in seen))
        dones = [d for _, d, _ in seen]
        self.assertEqual(dones, sorted(dones))
        # The stored configuration holds what was passed, in the CLI's canonical spelling.
        runs = kvlab.Session(path).runs()
        cfg = json.loads(runs.set_index("id").loc[r["run"], "config"])
        self.assertEqual(cfg["kv_cache"]["name"], "h2o-default")
        self.assertEqual(cfg["kv_cache"]["cache_length"], 64)
        self.assertEqual(cfg["data"]["seq_length"], 256)
        self.assertIn("loss", r["result"])

    def test_keyboard_interrupt_cancels_and_leaves_the_session_sound(self):
        path = os.path.join(WORK, "interrupt.kvlab")
        first = kvlab.eval_long("tiny", session=path, **SMALL)
        self.assertEqual(first["status"], "done")
        sent = []

        def interrupt_once(run, done, total, what):
            if not sent:  # Ctrl-C as the terminal sends it, while the run works
                sent.append(run)
                os.kill(os.getpid(), signal.SIGINT)

        with self.assertRaises(KeyboardInterrupt):
            kvlab.eval_long("tiny", session=path, progress=interrupt_once,
                            **{"data.seq_length": 8192, "data.num_samples": 8, "kv_cache.chunk_size": 32})
        self.assertTrue(sent)
        self.assertEqual(integrity(path), "ok")
        runs = kvlab.Session(path).runs().set_index("id")
        self.assertEqual(runs.loc[sent[0], "status"], "cancelled")
        self.assertEqual(runs.loc[first["run"], "status"], "done")  # earlier runs intact
        again = kvlab.eval_long("tiny", session=path, **SMALL)  # the session still takes runs
        self.assertEqual(again["status"], "done")

    def test_sweep_runs_each_cell_once(self):
        path = os.path.join(WORK, "sweep.kvlab")
        opts = dict(SMALL)
        opts["kv_cache.name"] = ["h2o", "lastrec"]
        opts["kv_cache.cache_length"] = 64
        cells = kvlab.sweep("tiny", session=path, options=opts)
        self.assertEqual(len(cells), 3)  # the dense reference + two policies
        self.assertEqual(sum(c["reference"] for c in cells), 1)
        self.assertTrue(all(c["status"] == "done" and not c["skipped"] for c in cells))
        self.assertEqual({c["coords"].get("kv_cache.name") for c in cells if not c["reference"]},
                         {"h2o", "lastrec"})
        again = kvlab.sweep("tiny", session=path, options=opts)
        self.assertTrue(all(c["skipped"] for c in again))
        self.assertEqual([c["run"] for c in again], [c["run"] for c in cells])
        self.assertEqual(len(kvlab.Session(path).runs()), 3)

    def test_a_failed_run_raises_and_stays_recorded(self):
        path = os.path.join(WORK, "failed.kvlab")
        # Too short for the task: refused when the run starts (the data is built).
        with self.assertRaisesRegex(kvlab.RunFailed, "seq_length") as ctx:
            kvlab.eval_long("tiny", session=path, **{"data.seq_length": 128, "data.num_samples": 1})
        runs = kvlab.Session(path).runs().set_index("id")
        self.assertEqual(runs.loc[ctx.exception.result["run"], "status"], "failed")
        self.assertIn("seq_length", runs.loc[ctx.exception.result["run"], "error"])

    def test_generate_returns_its_text_even_when_it_is_not_utf8(self):
        # tiny's random weights produce arbitrary bytes: invalid sequences are replaced, not fatal.
        r = kvlab.generate("tiny", session=os.path.join(WORK, "gen.kvlab"), prompt="hello", max_new_tokens=8)
        self.assertEqual(r["status"], "done")
        self.assertIsInstance(r["result"], str)
        self.assertEqual(json.loads(r["summary"])["generated_tokens"], 8)

    def test_the_kernel_variants_of_the_build_are_found(self):
        # python3 is not in build/bin: the package names the folder so the variants load.
        self.assertNotIn("not found", kvlab._kvlab.cpu_variant())

    def test_bad_options_are_refused_with_the_cli_message(self):
        path = os.path.join(WORK, "bad.kvlab")
        with self.assertRaisesRegex(ValueError, "kv_cache.cache_length"):
            kvlab.eval_long("tiny", session=path, kv_cache__cache_length="many")
        with self.assertRaisesRegex(ValueError, "unknown option --no_such.option"):
            kvlab.eval_long("tiny", session=path, options={"no_such.option": 1})
        with self.assertRaisesRegex(ValueError, "threads"):
            kvlab.eval_long("tiny", session=path, threads=-3)


if __name__ == "__main__":
    unittest.main(argv=sys.argv[:1], verbosity=2)
