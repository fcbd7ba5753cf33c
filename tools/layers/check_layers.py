#!/usr/bin/env python3
"""Layer check: fails when a file includes a header from a layer it must not depend on.

The layers (docs/ARCHITECTURE.md draws them), lowest first. A file may include headers of its
own layer and of the layers listed as below it; nothing else of ours. System and third-party
headers (<...>) are not checked.

    kernels          kernels/
    engine core      engine/{core,memory,backend,ops,telemetry}      (one library: kvlab_core)
    engine modules   engine/{tokenizer,io,gguf}                      (kvlab_tokenizer/modelio/gguf)
    engine dist      engine/dist/  over engine core (kvlab_dist: MPI/NCCL); train stands on it
    engine           the rest of engine/ (kvlab_engine), bottom-up:
                       model < kv < driver < data, grad < run < generate, train
    storage          storage/        over engine core only (the telemetry record vocabulary)
    sessions         sessions/       over engine and storage
    views            views/          over storage only (no engine, no sessions)
    bench            bench/          over everything but app/
    app, python, tests, fuzz, tools  over everything

Usage: check_layers.py SOURCE_ROOT [build/compile_commands.json]
       check_layers.py --self-test   (the check reports each kind of violation, passes a clean tree)
With a compile database, every translation unit it lists must also be a file this check saw
(so a new top-level folder cannot slip past the table). Prints one line per violation.
"""
import json
import os
import re
import sys

CORE = ("engine/core/", "engine/memory/", "engine/backend/", "engine/ops/", "engine/telemetry/")
MODULES = ("engine/tokenizer/", "engine/io/", "engine/gguf/")
BASE = ("kernels/",) + CORE + MODULES  # what every folder of the engine proper stands on

# (name, path prefixes that belong to it, prefixes it may include)
LAYERS = [
    ("kernels", ("kernels/",), ("kernels/",)),
    ("engine core", CORE, ("kernels/",) + CORE),
    # Each module stands alone on the core (no module includes another, nor the engine proper).
    ("engine/tokenizer", ("engine/tokenizer/",), ("kernels/",) + CORE + ("engine/tokenizer/",)),
    ("engine/io", ("engine/io/",), ("kernels/",) + CORE + ("engine/io/",)),
    ("engine/gguf", ("engine/gguf/",), ("kernels/",) + CORE + ("engine/gguf/",)),
    # The engine proper, bottom-up: each folder may include the ones listed before it.
    ("engine/model", ("engine/model/",), BASE + ("engine/model/",)),
    ("engine/kv", ("engine/kv/",), BASE + ("engine/model/", "engine/kv/")),
    ("engine/driver", ("engine/driver/",), BASE + ("engine/model/", "engine/kv/", "engine/driver/")),
    ("engine/data", ("engine/data/",), BASE + ("engine/model/", "engine/kv/", "engine/driver/", "engine/data/")),
    ("engine/grad", ("engine/grad/",), BASE + ("engine/model/", "engine/kv/", "engine/driver/", "engine/grad/")),
    ("engine/run", ("engine/run/",), BASE + ("engine/model/", "engine/kv/", "engine/driver/", "engine/data/", "engine/run/")),
    ("engine/generate", ("engine/generate/",),
     BASE + ("engine/model/", "engine/kv/", "engine/driver/", "engine/data/", "engine/run/", "engine/generate/")),
    ("engine/dist", ("engine/dist/",), ("kernels/",) + CORE + ("engine/dist/",)),
    ("engine/train", ("engine/train/",),
     BASE + ("engine/model/", "engine/kv/", "engine/driver/", "engine/data/", "engine/grad/", "engine/run/", "engine/dist/",
             "engine/train/")),
    ("engine", ("engine/",), ("kernels/", "engine/")),
    ("storage", ("storage/",), CORE + ("storage/",)),
    ("sessions", ("sessions/",), ("kernels/", "engine/", "storage/", "sessions/")),
    ("views", ("views/",), ("storage/", "views/")),
    ("plot", ("plot/",), ("plot/",)),
    ("bench", ("bench/",), ("kernels/", "engine/", "storage/", "sessions/", "views/", "bench/")),
    ("app", ("app/",), None),
    ("python", ("python/",), None),
    ("tests", ("tests/",), None),
    ("fuzz", ("fuzz/",), None),
    ("tools", ("tools/",), None),
]
SOURCE_EXT = (".h", ".hpp", ".cpp", ".cc", ".cu", ".cuh")
INCLUDE = re.compile(r'^\s*#\s*include\s+"([^"]+)"', re.M)


def layer_of(rel):
    for name, owns, allowed in LAYERS:
        if rel.startswith(owns):
            return name, allowed
    return None, None


def resolve(root, rel_file, inc):
    """Repository-relative path of a quoted include (as the compiler finds it: the including
    file's folder first, then the repository root, the one include directory we add)."""
    local = os.path.normpath(os.path.join(os.path.dirname(rel_file), inc))
    if os.path.exists(os.path.join(root, local)):
        return local
    if os.path.exists(os.path.join(root, inc)):
        return os.path.normpath(inc)
    return None  # generated or third-party (e.g. a moc file): not ours to check


def check(root, seen=None):
    """Violations (one line each) among the files under the layers' folders of root."""
    seen = set() if seen is None else seen
    violations = []
    for top in sorted({owns for _, prefixes, _ in LAYERS for owns in prefixes}):
        for dirpath, dirnames, filenames in os.walk(os.path.join(root, top)):
            dirnames[:] = [d for d in dirnames if d not in ("build", "corpus", "fixtures")]
            for fn in filenames:
                if not fn.endswith(SOURCE_EXT):
                    continue
                rel = os.path.relpath(os.path.join(dirpath, fn), root)
                if rel in seen:
                    continue
                seen.add(rel)
                name, allowed = layer_of(rel)
                if allowed is None:
                    continue
                with open(os.path.join(root, rel), encoding="utf-8", errors="replace") as f:
                    text = f.read()
                for m in INCLUDE.finditer(text):
                    target = resolve(root, rel, m.group(1))
                    if target is None or target.startswith(allowed):
                        continue
                    line = text.count("\n", 0, m.start()) + 1
                    tname, _ = layer_of(target)
                    violations.append(f"{rel}:{line}: {name} includes {target} ({tname or 'outside every layer'})")
    return violations


def self_test():
    """The check must fail on each kind of violation and pass a clean tree."""
    import tempfile

    cases = {
        "views/a.h": ('#include "engine/kv/kv_policy.h"\n', True),
        "views/b.cpp": ('#include "sessions/run_manager.h"\n', True),
        "storage/c.cpp": ('#include "engine/kv/kv_policy.h"\n', True),
        "engine/io/d.h": ('#include "engine/model/transformer.h"\n', True),
        "engine/core/e.cpp": ('#include "engine/kv/kv_policy.h"\n', True),
        "kernels/f.cpp": ('#include "engine/core/tensor.h"\n', True),
        "engine/kv/g.cpp": ('#include "storage/rows.h"\n', True),
        "engine/model/h.cpp": ('#include "engine/kv/kv_policy.h"\n', True),
        "views/ok.cpp": ('#include "storage/rows.h"\n#include "views/a.h"\n#include <vector>\n', False),
        "app/ok.cpp": ('#include "sessions/run_manager.h"\n#include "views/a.h"\n', False),
    }
    headers = ["engine/kv/kv_policy.h", "sessions/run_manager.h", "engine/model/transformer.h",
               "engine/core/tensor.h", "storage/rows.h"]
    failures = 0
    with tempfile.TemporaryDirectory() as d:
        for h in headers:
            os.makedirs(os.path.join(d, os.path.dirname(h)), exist_ok=True)
            open(os.path.join(d, h), "w").close()
        for path, (text, _) in cases.items():
            os.makedirs(os.path.join(d, os.path.dirname(path)), exist_ok=True)
            with open(os.path.join(d, path), "w") as f:
                f.write(text)
        found = {v.split(":")[0] for v in check(d)}
        for path, (_, bad) in cases.items():
            if (path in found) != bad:
                print(f"self-test: {path} {'not reported' if bad else 'reported'} ({cases[path][0].strip()})")
                failures += 1
    print(f"check_layers self-test: {len(cases)} cases, {failures} wrong")
    return 1 if failures else 0


def main():
    if len(sys.argv) == 2 and sys.argv[1] == "--self-test":
        return self_test()
    if len(sys.argv) < 2:
        print("usage: check_layers.py SOURCE_ROOT [compile_commands.json]", file=sys.stderr)
        return 2
    root = os.path.abspath(sys.argv[1])
    seen = set()
    violations = check(root, seen)
    if len(sys.argv) > 2:
        with open(sys.argv[2]) as f:
            for entry in json.load(f):
                path = os.path.abspath(os.path.join(entry.get("directory", ""), entry["file"]))
                if not path.startswith(root + os.sep):
                    continue
                rel = os.path.relpath(path, root)
                if rel.startswith("build") or "/build/" in rel or not os.path.exists(path):
                    continue  # generated, or a stale entry of a file moved since the last configure
                if rel not in seen:
                    violations.append(f"{rel}: compiled but in no layer of tools/layers/check_layers.py; add its folder to the table")
    for v in violations:
        print(v)
    print(f"check_layers: {len(seen)} files, {len(violations)} violation(s)")
    return 1 if violations else 0


if __name__ == "__main__":
    sys.exit(main())
