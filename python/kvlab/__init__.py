"""kvlab from Python: runs with the CLI's option table, sessions as pandas DataFrames.

    import kvlab
    r = kvlab.eval_long("tiny", session="s.kvlab", **{"kv_cache.name": "h2o-default"})
    s = kvlab.Session("s.kvlab")
    s.runs(); s.metrics(r["run"]); s.tokens(r["run"])

Option names are the CLI's without "--" (``kvlab eval_long --help``); dotted names go in a
dict (``**{"kv_cache.cache_length": 64}``) or with "__" for the dot (``kv_cache__cache_length=64``).
Lists become comma lists (sweep axes). See docs/PYTHON.md.
"""
import json
import os

import pandas as pd

# In a build tree the CPU kernel variants and plugins are in build/bin, not beside python3:
# name that folder before the engine looks (installed, they are in /usr/lib/kvlab, found from
# /usr/bin, python3's own folder).
_bin = os.path.normpath(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "bin"))
if os.path.isfile(os.path.join(_bin, "kvlab")):
    os.environ.setdefault("KVLAB_BIN_DIR", _bin)

from . import _kvlab  # noqa: E402
from . import policy_loading as _policy_loading

__version__ = _kvlab.__version__


def _text(value):
    """An option value as the command line spells it."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (list, tuple)):
        return ",".join(_text(v) for v in value)
    return str(value)


def _options(options, kwargs):
    merged = dict(options or {})
    for k, v in kwargs.items():
        merged[k.replace("__", ".")] = v
    return [(k, _text(v)) for k, v in merged.items()]


class RunFailed(RuntimeError):
    """A run ended `failed`; .result is run()'s dict (run id, message, session)."""

    def __init__(self, result):
        super().__init__("run %d of session %s failed: %s" % (result["run"], result["session"], result["message"]))
        self.result = result


def run(mode, model, session, options=None, progress=None, **kwargs):
    """Runs `mode` (eval_long, infer, generate, finetune_*) of `model` into `session`.

    Returns a dict: run (id), status, message, result, summary (JSON text), session.
    progress(run, done, total, what) is called on this thread while the run works.
    Ctrl-C (KeyboardInterrupt) cancels the run (status cancelled) and propagates; a run that
    fails raises RunFailed (it stays in the session, status failed, with its error)."""
    r = _kvlab.run(str(session), mode, str(model), _options(options, kwargs), progress)
    if r["status"] == "failed":
        raise RunFailed(r)
    return r


def eval_long(model, session, options=None, progress=None, **kwargs):
    """`kvlab eval_long MODEL --session SESSION --option value ...`."""
    return run("eval_long", model, session, options, progress, **kwargs)


def generate(model, session, options=None, progress=None, **kwargs):
    """`kvlab generate MODEL --session SESSION ...`."""
    return run("generate", model, session, options, progress, **kwargs)


def sweep(model, session, options=None, progress=None, **kwargs):
    """`kvlab sweep MODEL --session SESSION ...`: list values (or comma text) make axes.

    Returns one dict per cell (as run() does, plus name, reference, coords, skipped: the
    session already held the cell)."""
    return _kvlab.sweep(str(session), str(model), _options(options, kwargs), progress)


def register_policy(name, cls, options=None, summary=None):
    """Registers the class `cls` as the KV-cache policy `name` for runs started afterwards in
    this process (cache names "{name}-{buffer}", e.g. kv_cache.name "knorm_py-default").
    The class contract is in kvlab/policy_loading.py and docs/PYTHON.md."""
    _policy_loading.register_class(_kvlab, name, cls, options, summary)


def load_policy_file(path, name=None, options=None):
    """Registers the one policy class a Python file defines, as `name`, else the file's
    POLICY_NAME, else its stem (my_policy.py -> "my_policy"). Returns the policy name."""
    return _policy_loading.load_file(_kvlab, path, name, options)


def policy_names():
    """Every policy name: the built-in ones and those registered in this process."""
    return list(_kvlab.policy_names())


def run_options():
    """The run option table as a DataFrame: name, group, help, choices, default."""
    return pd.DataFrame(_kvlab.run_options())


class Session:
    """A session file opened read-only; each table of a run as a pandas DataFrame, with the
    column names of docs/SESSIONS.md and of `kvlab export ... --format csv`."""

    def __init__(self, path):
        self._d = _kvlab.SessionData(str(path))

    @property
    def path(self):
        return self._d.path

    def runs(self):
        """One row per run: id, name, status, times, progress, error, config and summary JSON."""
        return pd.DataFrame(self._d.runs())

    def summaries(self):
        """One row per run: its id, name, status, config (flattened, dotted names) and summary
        (flattened) as columns, "config." and "summary." prefixed."""
        runs = self._d.runs()
        rows = []
        for i, rid in enumerate(runs["id"]):
            row = {"id": int(rid), "name": runs["name"][i], "status": runs["status"][i]}
            for prefix, text in (("config", runs["config"][i]), ("summary", runs["summary"][i])):
                try:
                    flat = pd.json_normalize(json.loads(text or "{}"), sep=".")
                except ValueError:
                    continue
                for k, v in flat.iloc[0].items() if len(flat) else []:
                    row[prefix + "." + k] = v
            rows.append(row)
        return pd.DataFrame(rows)

    def metrics(self, run):
        """id, name, step, value, t_ns, t_rel_ns (kvlab export --what metrics)."""
        return pd.DataFrame(self._d.metrics(int(run)))

    def spans(self, run):
        """kvlab export --what spans columns."""
        return pd.DataFrame(self._d.spans(int(run)))

    def memory(self, run):
        """kvlab export --what memory columns (memory events)."""
        return pd.DataFrame(self._d.memory(int(run)))

    memory_events = memory

    def tokens(self, run):
        """sample, position, token_id, piece, loss (NaN where unscored): per-token losses
        (kvlab export --what tokens)."""
        return pd.DataFrame(self._d.tokens(int(run)))

    def samples(self, run):
        """One row per evaluated sample: mean_loss, scored, correct, token_accuracy."""
        return pd.DataFrame(self._d.samples(int(run)))

    def logs(self, run):
        return pd.DataFrame(self._d.logs(int(run)))

    def cache_steps(self, run):
        """One row per cache step (layer x chunk x pass): input_pos, num_tokens, cache_length
        and the replay log's plan shape (rows, moves, length_after)."""
        return pd.DataFrame(self._d.cache_steps(int(run)))

    def kept_slots(self, run, layer, pass_=0):
        """(cache_steps ids, int32 array (steps, rows, slots)): the token position held by each
        slot of `layer` after each step, replayed from the stored replay logs (-1: empty)."""
        return self._d.kept_slots(int(run), int(layer), int(pass_))

    def scores(self, run):
        """One row per score snapshot (layer x chunk): shape B, G, T and statistics;
        has_values where the full array was stored (score_values)."""
        return pd.DataFrame(self._d.scores(int(run)))

    def score_values(self, run, snapshot_id):
        """The (B, G, T) float32 scores of one snapshot (an id of scores(run))."""
        return self._d.score_values(int(run), int(snapshot_id))
