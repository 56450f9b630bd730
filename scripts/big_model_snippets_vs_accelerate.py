"""The seeds' big-model snippets (tests/unit/test_big_model_snippets.py) under Accelerate and under hpc, side by
side: device maps and outputs must be equal. Needs an Accelerate checkout or unpacked wheel (no install):

    .venv/bin/python scripts/big_model_snippets_vs_accelerate.py /tmp/acc-pkg

Prints one line per snippet and exits 1 if any differs.
"""

import subprocess
import sys
import tempfile
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests" / "unit"))
sys.path.insert(0, str(ROOT))

import test_big_model_snippets as snippets  # noqa: E402


def main(source: str) -> int:
    with tempfile.TemporaryDirectory(prefix="hpc-vs-accelerate-") as tmp:
        tmp = Path(tmp)
        out = tmp / "accelerate.pt"
        (tmp / "acc").mkdir()
        (tmp / "hpc").mkdir()
        code = (f"import sys; sys.path.insert(0, {str(ROOT / 'tests' / 'unit')!r}); from pathlib import Path; "
                "import torch, test_big_model_snippets as s; "
                f"torch.save(s.run_all('accelerate', Path({str(tmp / 'acc')!r})), {str(out)!r})")
        env = {"PYTHONPATH": f"{source}:{ROOT}", "PATH": "/usr/bin:/bin"}
        proc = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=600)
        if proc.returncode != 0:
            print(proc.stderr[-3000:], file=sys.stderr)
            return 2
        # written a moment ago by our own subprocess into a TemporaryDirectory (0700, ours alone): no one else's pickle
        theirs = torch.load(out, weights_only=False)
        ours = snippets.run_all("hpc", tmp / "hpc")
    differ = 0
    for name, result in ours.items():
        problems = []
        for key, value in result.items():
            if key == "refused":
                continue  # ValueError there, HpcError here
            other = theirs[name][key]
            equal = snippets.same(value, other) if isinstance(value, torch.Tensor) else value == other
            if not equal:
                problems.append(key)
        differ += bool(problems)
        print(f"{name:<45} {'same' if not problems else 'DIFFERS: ' + ', '.join(problems)}")
    return 1 if differ else 0


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit("usage: big_model_snippets_vs_accelerate.py ACCELERATE_SOURCE_FOLDER")
    sys.exit(main(sys.argv[1]))
