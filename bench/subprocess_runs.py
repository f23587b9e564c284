"""One child process per variant of a GPU benchmark (clean GPU memory, its own warm-up).

``run_each(script, flag, names, out_dir, prefix, key)`` re-runs ``script`` with the parent's
own arguments plus ``flag NAME --json out_dir/prefix_NAME.json`` for each name, and returns
the JSON each child wrote; a child that wrote none (it crashed) is a row ``{key: NAME,
"error": ...}``, so the parent's table still says which variant failed.
"""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path


def run_each(script: str, flag: str, names: list[str], out_dir: str | Path, prefix: str,
             key: str) -> list[dict]:
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    rows = []
    for name in names:
        path = out_dir / f"{prefix}_{name}.json"
        cmd = [sys.executable, script, flag, name, "--json", str(path), *sys.argv[1:]]
        print("$", " ".join(cmd), flush=True)
        subprocess.run(cmd, check=False)
        rows.append(json.loads(path.read_text()) if path.exists()
                    else {key: name, "error": "no result file"})
    return rows
