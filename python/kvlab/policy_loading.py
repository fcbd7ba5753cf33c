"""A Python class as a kvlab KV-cache policy: the class contract, and loading it from a file.

Plain Python and standard library only: the `kvlab` package uses it over its extension, and
the kvlab CLI (--kv_cache.policy_file) loads this file by path over its embedded interpreter,
so `backend` is the module whose register_policy reaches the engine in use.

One instance per layer cache, made as cls(**options). The class declares what it reads:
  needs             some of "key_norm", "value_norm", "keys", "queries", "token_ids",
                    "attention" (positions and the layer index always come)
  attention_window  with "attention": only the chunk's last queries vote (0: all)
and scores slots, lower = evicted first, on the built-in score policies' machinery (grace
ring, keep-initial rule, ties to the lower slot):
  score(f)   the new tokens' scores, float32 (rows, n); rows = batch x KV heads
  update(f)  with "attention": after a chunk attended, rescore from f.weights (rows, length):
             write f.scores (rows, slots) in place (return None) or return (rows, length).
f holds layer, input_pos, n, rows, groups, slots, length and the declared features as NumPy
views of the engine's arrays (no copies; read-only except f.scores; valid during the call
only: copy what you keep). An exception fails the run with its traceback.
"""
import importlib.util
import os


def register_class(backend, name, cls, options=None, summary=None):
    opts = dict(options or {})
    probe = cls(**opts)
    if not callable(getattr(probe, "score", None)):
        raise TypeError("policy %r: %s has no score(f) method; expected one returning (rows, n) scores" % (name, cls.__name__))
    needs = [str(x) for x in getattr(probe, "needs", ())]
    window = int(getattr(probe, "attention_window", 0))
    has_update = callable(getattr(probe, "update", None))
    if summary is None:
        doc = (cls.__doc__ or "").strip()
        summary = doc.splitlines()[0] if doc else "Python policy %s" % cls.__name__
    backend.register_policy(str(name), summary, needs, window, has_update, lambda layer: cls(**opts))


def load_file(backend, path, name=None, options=None):
    if not os.path.isfile(path):
        raise ValueError("policy file %r does not exist; expected a .py file defining a policy class" % path)
    stem = os.path.splitext(os.path.basename(path))[0]
    spec = importlib.util.spec_from_file_location("kvlab_policy_" + stem, path)
    if spec is None:
        raise ValueError("policy file %r is not a Python file; expected a .py file defining a policy class" % path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    classes = [v for v in vars(mod).values()
               if isinstance(v, type) and v.__module__ == mod.__name__ and callable(getattr(v, "score", None))]
    if len(classes) != 1:
        raise ValueError("policy file %r defines %d classes with a score method; expected exactly one" % (path, len(classes)))
    policy = name or getattr(mod, "POLICY_NAME", stem)
    register_class(backend, policy, classes[0], options)
    return policy
