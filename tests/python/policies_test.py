#!/usr/bin/env python3
"""python.policies: policies written in Python (python/examples) make the same decisions as
their built-in counterparts bit for bit on `tiny` (the stored replay-log rows of the two runs
are identical, and so are the stored score arrays; in eval, decode-time eviction and a LoRA
fine-tuning run's losses and gradient norms), a deliberately different scorer does not
(the comparison can fail), features arrive as read-only NumPy views without copies, and an
exception in Python fails the run with its traceback while earlier runs stay intact.

Usage: policies_test.py KVLAB_BINARY WORK_DIR   (PYTHONPATH holds build/python)"""
import json
import os
import shutil
import sqlite3
import subprocess
import sys
import unittest

import numpy as np

import kvlab

HERE = os.path.dirname(os.path.abspath(__file__))
EXAMPLES = os.path.join(HERE, "..", "..", "python", "examples")
KVLAB = sys.argv[1] if len(sys.argv) > 1 else "build/bin/kvlab"
WORK = sys.argv[2] if len(sys.argv) > 2 else "/tmp/kvlab-python-policies"
CHUNK = 32
BASE = {"data.seq_length": 512, "data.num_samples": 2, "kv_cache.cache_length": 64, "kv_cache.chunk_size": CHUNK,
        "telemetry.score_interval": 1}


def setUpModule():
    shutil.rmtree(WORK, ignore_errors=True)
    os.makedirs(WORK)
    kvlab.load_policy_file(os.path.join(EXAMPLES, "knorm.py"))
    kvlab.load_policy_file(os.path.join(EXAMPLES, "snapkv.py"))
    kvlab.load_policy_file(os.path.join(EXAMPLES, "keydiff.py"))


def replay_rows(path, run):
    con = sqlite3.connect("file:" + path + "?mode=ro", uri=True)
    try:
        return con.execute("SELECT layer, chunk, pass, input_pos, num_tokens, cache_length, replay_log FROM cache_steps "
                           "WHERE run_id = ? ORDER BY id", (run,)).fetchall()
    finally:
        con.close()


# Each example and the built-in it mirrors.
PAIRS = (("knorm", "knorm_py"), ("snapkv", "snapkv_py"), ("keydiff", "keydiff_py"))


def smollm2_path():
    return os.path.join(os.environ.get("KVLAB_ASSETS", os.path.join(HERE, "..", "..", "assets", "cache")),
                        "SmolLM2-135M-Instruct.Q4_1.gguf")


def models():
    """tiny always; SmolLM2-135M when its file is there (scripts/fetch_assets.sh, as in CI)."""
    return ("tiny", "smollm2-135m") if os.path.exists(smollm2_path()) else ("tiny",)


def pairs(model):
    """Every pair on tiny; on SmolLM2 the one whose features are the attention weights (snapkv):
    the others' paths are the same on both models, and a LoRA run of the 135M model costs
    seconds per pair."""
    return PAIRS if model == "tiny" else tuple(p for p in PAIRS if p[0] == "snapkv")


def eval_run(path, cache, model="tiny", options=None):
    return kvlab.eval_long(model, session=path, options=dict(options or BASE, **{"kv_cache.name": cache}))["run"]


class WrongKnorm:
    """knorm with the sign flipped: evicts the other tokens"""
    needs = ("key_norm",)

    def score(self, f):
        return f.key_norm.copy()


class Probe:
    """records what a scorer receives"""
    needs = ("key_norm", "keys")
    seen = []

    def score(self, f):
        Probe.seen.append((f.layer, f.key_norm.flags.owndata, f.key_norm.flags.writeable, f.keys.shape,
                           f.positions.shape, f.rows, f.n))
        return -f.key_norm


class ValuesProbe:
    """Reads the new tokens' values and checks them against the engine's own value norms (an
    independent path: ops::norm_last on the device) while scoring as knorm does."""

    needs = ("values", "value_norm", "key_norm")
    checked = 0

    def score(self, f):
        assert f.values.shape == (f.rows, f.n, f.values.shape[2])
        np.testing.assert_allclose(np.linalg.norm(f.values.astype(np.float64), axis=-1), f.value_norm, rtol=1e-5, atol=1e-6)
        ValuesProbe.checked += 1
        return -f.key_norm


class FailsAtChunk3:
    """raises in the fourth chunk (64-token prefill, then 32-token chunks)"""
    needs = ("key_norm",)

    def score(self, f):
        if f.input_pos == 64 + 2 * CHUNK:
            raise RuntimeError("boom at chunk 3")
        return -f.key_norm


class WrongShape:
    needs = ()

    def score(self, f):
        return np.zeros(3, np.float32)


class Decisions(unittest.TestCase):
    def check_same(self, builtin, python, model="tiny", options=None):
        path = os.path.join(WORK, builtin + "." + model + ".kvlab")
        a, b = eval_run(path, builtin + "-default", model, options), eval_run(path, python + "-default", model, options)
        ra, rb = replay_rows(path, a), replay_rows(path, b)
        self.assertGreater(len(ra), 0)
        self.assertEqual(len(ra), len(rb))
        for x, y in zip(ra, rb):
            self.assertEqual(x, y)
        # The stored score arrays too (every chunk: telemetry.score_interval 1).
        s = kvlab.Session(path)
        sa, sb = s.scores(a), s.scores(b)
        self.assertEqual(len(sa), len(sb))
        compared = 0
        for ia, ib, hv in zip(sa["id"], sb["id"], sa["has_values"]):
            if hv:
                np.testing.assert_array_equal(s.score_values(a, ia), s.score_values(b, ib))
                compared += 1
        self.assertGreater(compared, 0)
        return path, a

    def test_knorm_in_python_equals_the_builtin(self):
        path, a = self.check_same("knorm", "knorm_py")
        # The comparison can fail: a different scorer changes the replay logs.
        kvlab.register_policy("knorm_wrong", WrongKnorm)
        c = eval_run(path, "knorm_wrong-default")
        self.assertNotEqual(replay_rows(path, a), replay_rows(path, c))

    def test_snapkv_in_python_equals_the_builtin(self):
        self.check_same("snapkv", "snapkv_py")

    def test_the_examples_equal_the_builtins_on_smollm2(self):
        # The real model (30 layers, 3 KV heads of 64): real keys and attention, not random ones.
        gguf = smollm2_path()
        if not os.path.exists(gguf):
            self.skipTest(gguf + " is absent (scripts/fetch_assets.sh fetches it)")
        short = dict(BASE, **{"data.seq_length": 320, "data.num_samples": 1})
        for builtin, python in PAIRS:
            with self.subTest(policy=builtin):
                self.check_same(builtin, python, "smollm2-135m", short)

    def test_fidelity_measures_a_python_policy_as_its_builtin(self):
        # Fidelity only reads the decisions: the same plans give the same kept mass and
        # efficiency against the oracle, to the bit.
        path = os.path.join(WORK, "fidelity.kvlab")
        opts = dict(BASE, **{"data.num_samples": 1, "data.seq_length": 256, "fidelity": True})
        a, b = eval_run(path, "knorm-default", options=opts), eval_run(path, "knorm_py-default", options=opts)
        s = kvlab.Session(path).summaries().set_index("id")
        for key in ("summary.fidelity_kept_mass", "summary.fidelity_efficiency", "summary.fidelity_next_token_kl"):
            self.assertTrue(np.isfinite(s.loc[a, key]), key)
            self.assertEqual(s.loc[a, key], s.loc[b, key], key)

    def test_values_are_the_new_tokens_values(self):
        kvlab.register_policy("values_probe", ValuesProbe)
        path = os.path.join(WORK, "values.kvlab")
        a, b = eval_run(path, "knorm-default"), eval_run(path, "values_probe-default")
        self.assertGreater(ValuesProbe.checked, 0)
        self.assertEqual(replay_rows(path, a), replay_rows(path, b))  # it scores as knorm does

    def test_keydiff_in_python_equals_the_builtin(self):
        # A class with its own state, rescoring every held slot in update() without attention.
        self.check_same("keydiff", "keydiff_py")

    def test_decode_time_eviction_is_the_same(self):
        for model in models():
            for builtin, python in pairs(model):
                with self.subTest(model=model, policy=builtin):
                    path = os.path.join(WORK, "generate." + model + ".kvlab")
                    opts = {"kv_cache.cache_length": 16, "prompt": "hello world, this is a test", "max_new_tokens": 40}
                    a = kvlab.generate(model, session=path, options=dict(opts, **{"kv_cache.name": builtin + "-default"}))
                    b = kvlab.generate(model, session=path, options=dict(opts, **{"kv_cache.name": python + "-default"}))
                    self.assertGreater(json.loads(a["summary"])["decode_evicting_forwards"], 0)  # the cache evicted while decoding
                    self.assertEqual(a["result"], b["result"])
                    self.assertEqual(replay_rows(path, a["run"]), replay_rows(path, b["run"]))

    def test_a_lora_steps_gradients_are_the_same(self):
        # Gradients flow through the evicting cache: equal plans give equal losses and gradient
        # norms, step for step (on tiny step 2's loss follows step 1's update).
        for model in models():
            for builtin, python in pairs(model):
                with self.subTest(model=model, policy=builtin):
                    path = os.path.join(WORK, "lora." + model + ".kvlab")
                    steps = 2 if model == "tiny" else 1
                    opts = {"kv_cache.cache_length": 64, "kv_cache.chunk_size": CHUNK, "data.seq_length": 256 if model == "tiny" else 128,
                            "data.num_samples": 4 if model == "tiny" else 2, "train.max_steps": steps}
                    runs = [kvlab.run("finetune_long_lora", model, session=path, options=dict(opts, **{"kv_cache.name": c + "-default"}))["run"]
                            for c in (builtin, python)]
                    self.assertEqual(replay_rows(path, runs[0]), replay_rows(path, runs[1]))
                    s = kvlab.Session(path)
                    for name in ("loss", "grad_norm"):
                        va = s.metrics(runs[0]).query("name == @name")["value"].to_numpy()
                        vb = s.metrics(runs[1]).query("name == @name")["value"].to_numpy()
                        self.assertEqual(len(va), steps, name)
                        np.testing.assert_array_equal(va, vb, err_msg=name)


class Cli(unittest.TestCase):
    def cli(self, *args):
        return subprocess.run([KVLAB] + list(args), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)

    def test_policy_file_runs_in_the_cli_with_the_builtins_decisions(self):
        path = os.path.join(WORK, "cli.kvlab")
        common = ["--kv_cache.cache_length", "64", "--data.seq_length", "512", "--kv_cache.chunk_size", str(CHUNK),
                  "--session", path]
        r = self.cli("eval_long", "tiny", "--kv_cache.policy_file", os.path.join(EXAMPLES, "knorm.py"),
                     "--kv_cache.name", "knorm_py-default", *common)
        self.assertEqual(r.returncode, 0, r.stdout)
        self.assertEqual(self.cli("eval_long", "tiny", "--kv_cache.name", "knorm-default", *common).returncode, 0)
        self.assertEqual(replay_rows(path, 1), replay_rows(path, 2))

    def test_a_missing_policy_file_is_named(self):
        r = self.cli("eval_long", "tiny", "--kv_cache.policy_file", os.path.join(WORK, "nope.py"),
                     "--kv_cache.name", "nope-default", "--session", os.path.join(WORK, "nope.kvlab"))
        self.assertNotEqual(r.returncode, 0)
        self.assertIn("nope.py' does not exist; expected a .py file", r.stdout)


class Contract(unittest.TestCase):
    def test_features_are_read_only_views(self):
        kvlab.register_policy("probe", Probe)
        eval_run(os.path.join(WORK, "probe.kvlab"), "probe-default")
        self.assertTrue(Probe.seen)
        layers = {s[0] for s in Probe.seen}
        self.assertEqual(layers, set(range(len(layers))))  # every layer index, from 0
        for layer, owndata, writeable, keys_shape, pos_shape, rows, n in Probe.seen:
            self.assertFalse(owndata)
            self.assertFalse(writeable)
            self.assertEqual(keys_shape[:2], (rows, n))
            self.assertEqual(pos_shape, (rows, 64))

    def test_an_exception_fails_the_run_with_its_traceback(self):
        path = os.path.join(WORK, "fails.kvlab")
        first = eval_run(path, "knorm_py-default")
        kvlab.register_policy("fails3", FailsAtChunk3)
        with self.assertRaises(kvlab.RunFailed) as ctx:
            eval_run(path, "fails3-default")
        msg = str(ctx.exception)
        self.assertIn("Traceback", msg)
        self.assertIn("boom at chunk 3", msg)
        self.assertIn(os.path.basename(__file__), msg)         # and the traceback names this file
        s = kvlab.Session(path)
        runs = s.runs().set_index("id")
        failed = ctx.exception.result["run"]
        self.assertEqual(runs.loc[failed, "status"], "failed")
        self.assertIn("boom at chunk 3", runs.loc[failed, "error"])
        self.assertTrue(s.logs(failed)["text"].str.contains("boom at chunk 3").any())
        self.assertEqual(runs.loc[first, "status"], "done")  # earlier runs intact
        self.assertEqual(len(replay_rows(path, first)), len(replay_rows(path, eval_run(path, "knorm-default"))))
        con = sqlite3.connect("file:" + path + "?mode=ro", uri=True)
        self.assertEqual(con.execute("PRAGMA integrity_check").fetchone()[0], "ok")
        con.close()

    def test_a_wrong_shape_names_the_expected_one(self):
        kvlab.register_policy("wrong_shape", WrongShape)
        with self.assertRaisesRegex(kvlab.RunFailed, r"expected float scores of shape \(\d+, \d+\)"):
            eval_run(os.path.join(WORK, "shape.kvlab"), "wrong_shape-default")

    def test_bad_registrations_are_refused(self):
        with self.assertRaisesRegex(ValueError, "built-in"):
            kvlab.register_policy("knorm", WrongKnorm)
        with self.assertRaisesRegex(ValueError, "not a word"):
            kvlab.register_policy("my-policy", WrongKnorm)
        bad = type("Bad", (), {"needs": ("colour",), "score": lambda self, f: None})
        with self.assertRaisesRegex(ValueError, "'colour' is not a feature; expected some of key_norm"):
            kvlab.register_policy("bad_needs", bad)
        with self.assertRaisesRegex(ValueError, "unknown KV cache policy|not_registered"):
            eval_run(os.path.join(WORK, "bad.kvlab"), "not_registered-default")


if __name__ == "__main__":
    unittest.main(argv=sys.argv[:1], verbosity=2)
