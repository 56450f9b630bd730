"""Bad input is one line on stderr, exit code 2, in bounded time and memory: never a hang, a MemoryError, a
traceback, a 200 MB "line" or a secret echoed back."""

import os
import subprocess
import time

import pytest

from hpc.cluster.config import safe_yaml
from hpc.contract import checks
from hpc.errors import HpcError, one_line, shown
from hpc.slurm import array_spec, hostlist
from tests.conftest import hpc_cmd

SECRET = "sekrit-4711"
SECONDS = 20  # each case hung for minutes, or died at once with a traceback, before
LOCAL_CAP = max(8, checks.LOCAL_PROCESSES_PER_CPU * (os.cpu_count() or 1))


def _bomb(levels: int = 7) -> str:
    """A 'billion laughs' YAML file: 9**levels strings from a few hundred bytes; its last anchor is ``bomb``.
    Seven levels (4.8 million strings) are far past the limit, yet a regression fails in seconds, not by OOM."""
    lines = ['lol0: &lol0 ["lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol"]']
    for i in range(1, levels):
        lines.append(f"lol{i}: &lol{i} [" + ", ".join([f"*lol{i - 1}"] * 9) + "]")
    return "x-anchors:\n" + "".join(f"  {line}\n" for line in lines) + f"  bomb: &bomb [*lol{levels - 1}]\n"


def _files(d):
    (d / "t.py").write_text("print('hi')\n")
    (d / "bomb-job.yaml").write_text(_bomb().replace("x-anchors:", "args-anchors:") + "args: *bomb\n")
    (d / "bomb-profile.yaml").write_text(_bomb() + "modules: *bomb\n")
    (d / "bomb-sweep.yaml").write_text("grid:\n  " + _bomb().replace("\n", "\n  ").replace("x-anchors:", "lr:"))
    (d / "self-alias.yaml").write_text("args: &a [*a]\n")
    (d / "secret-env.yaml").write_text(f"env:\n  WANDB_API_KEY: {SECRET}\n")
    (d / "secret-key.yaml").write_text(f"wandb_token: {SECRET}\n")
    (d / "nan.yaml").write_text("hang_timeout: .nan\n")
    values = ", ".join(map(str, range(1000)))
    (d / "grid.yaml").write_text("grid:\n" + "".join(f"  k{i}: [{values}]\n" for i in range(3)))
    (d / "big-array.yaml").write_text("extends: slurm-local\nmax_array_size: 5001\n")
    chain = d / "chain"
    chain.mkdir()
    for i in range(1100):  # past Python's recursion limit, which a recursive walk of `extends` hit
        (chain / f"p{i}.yaml").write_text(f"extends: p{i + 1}\n")
    (chain / "p1100.yaml").write_text("scheduler: slurm\n")


R = ["render", "-p", "slurm-local"]
CASES = {
    # YAML alias bombs: refused before anything walks (or prints) the billions of values
    "bomb in a job file": (["render", "--config", "bomb-job.yaml", "t.py"], "aliases", {}),
    "bomb in a profile": (["render", "-p", "./bomb-profile.yaml", "t.py"], "aliases", {}),
    "bomb in a sweep": ([*R, "--sweep", "bomb-sweep.yaml", "t.py"], "aliases", {}),
    "self-referencing alias": (["render", "--config", "self-alias.yaml", "t.py"], "refers to the list", {}),
    # secrets in refused values: the key is named, its value is not
    "secret in a job file's env": (["render", "--config", "secret-env.yaml", "t.py"], "WANDB_API_KEY", {}),
    "secret as an unknown key": (["render", "--config", "secret-key.yaml", "t.py"], "wandb_token", {}),
    "secret in --set": (["render", "--set", f"wandb_api_key={SECRET}", "t.py"], "wandb_api_key", {}),
    "secret in --set env": (["render", "--set", f"env=A=1,HF_TOKEN={SECRET}", "t.py"], "HF_TOKEN", {}),
    "secret in --env": (["render", "--env", f"WANDB_API_KEY={SECRET}", "t.py"], "WANDB_API_KEY", {}),
    "secret in HPC_ENV": (["render", "t.py"], "HF_TOKEN", {"HPC_ENV": f"HF_TOKEN={SECRET}"}),
    # sizes counted before anything is built
    "array with an exponent": ([*R, "--array", "0-1e9", "t.py"], "not a SLURM array spec", {}),
    "array past any int": ([*R, "--array", "0-99999999999999999999", "t.py"], "MaxArraySize", {}),
    "array past MaxArraySize": ([*R, "--array", "0-2000", "t.py"], "MaxArraySize 1001", {}),
    "array step 0": ([*R, "--array", "0-10:0", "t.py"], "step 0", {}),
    "hostlist product": ([*R, "-w", "n[0-999999][0-999999]", "t.py"], "more than 100000 hosts", {}),
    "hostlist of 5000 digits": ([*R, "-w", "n[" + "9" * 5000 + "]", "t.py"], "bad range", {}),
    "sweep grid 1000^3": ([*R, "--sweep", "grid.yaml", "t.py"], "1000 x 1000 x 1000", {}),
    "extends 1100 deep": (["render", "-p", "./chain/p0.yaml", "t.py"], "more than 16 levels deep (p0 -> p1", {}),
    # one above the cap, not a million: were the cap gone, this test must not fork a million Pythons
    "launch too many processes": (["launch", "--nproc", str(LOCAL_CAP + 1), "t.py"], "more processes than this", {}),
    "submit a million local processes": (["submit", "--dry-run", "--nproc", "1000000", "t.py"],
                                         "more processes than this machine", {}),
    # durations that are no number of seconds
    "hang timeout nan flag": (["render", "--hang-timeout", "nan", "t.py"], "--hang-timeout = nan", {}),
    "hang timeout inf set": (["render", "--set", "hang_timeout=inf", "t.py"], "not a finite number", {}),
    "hang timeout negative": (["render", "--hang-timeout", "-1", "t.py"], "not a finite number", {}),
    "hang timeout .nan in a file": (["render", "--config", "nan.yaml", "t.py"], "hang_timeout = nan", {}),
    "monitor interval nan": (["launch", "--monitor_interval", "nan", "t.py"], "--monitor_interval = nan", {}),
    "click's own usage error": (["render", "--nproc", "many", "t.py"], "see 'hpc render --help'", {}),
}


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    d = tmp_path_factory.mktemp("bad-input")
    _files(d)
    return d


def _hpc(folder, *args, env=None):
    full = {k: v for k, v in os.environ.items() if not k.startswith(("HPC_", "ACCELERATE_", "FSDP_", "SLURM_"))}
    full.update({"XDG_CONFIG_HOME": str(folder / "xdg"), "HF_HOME": str(folder / "hf"), **(env or {})})
    start = time.monotonic()
    proc = subprocess.run(hpc_cmd(*args), cwd=folder, env=full, capture_output=True, text=True, timeout=120,
                          check=False)
    return proc, time.monotonic() - start


@pytest.mark.parametrize("name", list(CASES))
def test_bad_input_is_one_short_line_and_exit_2(folder, name):
    args, expected, env = CASES[name]
    proc, took = _hpc(folder, *args, env=env)
    lines = proc.stderr.splitlines()
    assert proc.returncode == 2 and len(lines) == 1, proc.stderr[-3000:]
    assert lines[0].startswith("hpc: error: ") and expected in lines[0], lines[0]
    assert "lol', 'lol" not in lines[0] and SECRET not in proc.stderr + proc.stdout
    assert len(lines[0]) < (1500 if "unknown key" in lines[0] else 400), lines[0]
    assert took < SECONDS


def test_a_profile_raises_the_array_limit_to_its_clusters(folder):
    proc, _ = _hpc(folder, "render", "-p", "./big-array.yaml", "--array", "0-2000%8", "t.py")
    assert proc.returncode == 0 and "#SBATCH --array=0-2000%8" in proc.stdout, proc.stderr
    proc, _ = _hpc(folder, "render", "-p", "./big-array.yaml", "--array", "0-5001", "t.py")
    assert proc.returncode == 2 and "MaxArraySize 5001" in proc.stderr, proc.stderr


def test_shown_values_are_short_and_hide_secrets():
    bomb = ["lol"] * 9
    for _ in range(12):  # 9**13 strings, shared: only a bounded repr returns at all
        bomb = [bomb] * 9
    start = time.monotonic()
    assert len(shown(bomb)) <= 80 and len(shown("x" * 10**7)) <= 80 and len(shown(10**5000)) <= 80
    assert time.monotonic() - start < 1
    assert shown({"WANDB_API_KEY": SECRET, "A": "1"}) == "{'WANDB_API_KEY': <redacted>, 'A': '1'}"
    assert shown(f"A=1,HF_TOKEN={SECRET}") == "'A=1,HF_TOKEN=<redacted>'"
    assert shown([f"--api_key={SECRET}", "--lr=3"]) == "['--api_key=<redacted>', '--lr=3']"
    assert shown(SECRET, key="--set db_password") == shown(SECRET, key="grid.token") == "<redacted>"
    assert shown("node[1-4]", key="nodelist") == "'node[1-4]'"  # an ordinary value is shown as it is
    line = one_line("a" * 5000 + "; fix: do this")
    assert len(line) < 2100 and line.endswith("; fix: do this")


def test_yaml_limits(tmp_path):
    wide = tmp_path / "wide.yaml"
    wide.write_text("base: &b {" + ", ".join(f"k{i}: {i}" for i in range(200)) + "}\n"
                    + "".join(f"copy{i}: *b\n" for i in range(100)))  # 100 copies of 401 values: fine
    assert len(safe_yaml.load(wide)) == 101
    deep = tmp_path / "deep.yaml"
    deep.write_text("a: " + "[" * 100 + "]" * 100 + "\n")
    with pytest.raises(HpcError, match="nests deeper than 64"):
        safe_yaml.load(deep)
    huge_int = tmp_path / "int.yaml"
    huge_int.write_text("nodes: " + "9" * 5000 + "\n")
    with pytest.raises(HpcError, match="not a usable YAML value"):
        safe_yaml.load(huge_int)


def test_array_spec_counts_before_it_builds():
    spec = array_spec.parse("0-99,200-300:50%8", max_array_size=1001)
    assert (spec.count, spec.max_index, spec.max_running) == (103, 300, 8)
    assert spec.indices()[-3:] == [200, 250, 300]
    assert array_spec.parse("0-1001:1000", 1001).indices() == [0, 1000]  # the highest index, not the range's end
    for bad, problem in [("0-1001", "MaxArraySize 1001"), ("3-1", "runs backwards"), ("0-4%0", "no task"),
                         ("0-3," * 300 + "0", "task ids"), ("1,,2", "not a SLURM array spec")]:
        with pytest.raises(HpcError, match=problem):
            array_spec.parse(bad, 1001)


def test_hostlist_counts_before_it_expands():
    start = time.monotonic()
    for bad in ["n[1-99999,1-99999]", "a[0-999][0-999]", ",".join(["n[1-60000]"] * 2)]:
        with pytest.raises(HpcError, match="more than 100000 hosts"):
            hostlist.expand(bad)
    assert time.monotonic() - start < 2
    assert len(hostlist.expand("a[0-9][0-9999]")) == hostlist.MAX_HOSTS
