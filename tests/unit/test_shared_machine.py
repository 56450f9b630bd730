"""A login node shared with another user (nobody, uid 65534, plants folders and files first): nothing they write
is executed or trusted. The SSH connection folder, a function's results, job roots, job records, the code
snapshot, job templates, the status probe's temporary files and scripts/slurm-local's state folder.
All in-process or small subprocesses: no SLURM job."""

import json
import os
import pickle
import shlex
import shutil
import stat
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from hpc.cluster import backends, functions, snapshot, submission
from hpc.cluster import records as jobs
from hpc.cluster.backends.base import LocalFiles
from hpc.cluster.backends.remote import PRIVATE_JOB_DIR, RemoteSlurmBackend
from hpc.cluster.config import precedence
from hpc.cluster.config.schema import Remote
from hpc.cluster.folders import builtin_dir
from hpc.cluster.render import render
from hpc.cluster.ssh import Ssh
from hpc.errors import HpcError
from tests.conftest import SLURM_LOCAL, hpc_cmd
from tests.jobhelpers import hpc, launch_env

NOBODY = 65534


@pytest.fixture(autouse=True)
def _as_root():
    """Planting a file as another user (chown) needs root; CI runs as root, so there it must run."""
    if os.geteuid() != 0:
        if os.environ.get("CI"):
            pytest.fail("CI must run the shared-machine tests as root")
        pytest.skip("planting files as another user needs root")


def plant(path: Path, mode: int = 0o700) -> Path:
    """A folder another user made first, as they would leave it."""
    path.mkdir(parents=True, exist_ok=True)
    path.chmod(mode)
    os.chown(path, NOBODY, NOBODY)
    return path


class Plant:
    """A pickle that makes a folder when it is loaded: what a forged pickle could do as the one loading it."""

    def __init__(self, path: Path):
        self.path = str(path)

    def __reduce__(self):
        return os.mkdir, (self.path,)


def one_line(err: BaseException | str) -> str:
    text = str(err).strip()
    assert "\n" not in text, text
    return text


# --- 1. the SSH ControlMaster folder --------------------------------------------------------------------------
@pytest.fixture
def tmpdir_env(tmp_path, monkeypatch):
    """A temporary folder like /tmp (everyone may write, sticky), and no XDG_RUNTIME_DIR."""
    shared = tmp_path / "tmp"
    shared.mkdir(mode=0o1777)
    shared.chmod(0o1777)
    monkeypatch.setenv("TMPDIR", str(shared))
    monkeypatch.setattr(tempfile, "tempdir", None)
    monkeypatch.delenv("XDG_RUNTIME_DIR", raising=False)
    return shared


def control_path(remote: Remote) -> str:
    opts = Ssh(remote).options()
    return next(o.split("=", 1)[1] for o in opts if o.startswith("ControlPath="))


REMOTE = Remote(host="login.example.org", job_root="/scratch/me/jobs")


@pytest.mark.parametrize("kind,words", [
    ("nobody's", "belongs to uid 65534"),
    ("open", "open to group or others"),
    ("symlink", "is a symlink"),
])
def test_an_ssh_folder_someone_made_first_is_refused(tmpdir_env, tmp_path, kind, words):
    folder = tmpdir_env / f"hpc-ssh-{os.getuid()}"
    if kind == "nobody's":
        plant(folder)
    elif kind == "open":
        folder.mkdir(mode=0o755)
        folder.chmod(0o755)
    else:
        private = tmp_path / "mine"
        private.mkdir(mode=0o700)
        folder.symlink_to(private)
    with pytest.raises(HpcError) as err:
        Ssh(REMOTE).options()
    assert str(folder) in one_line(err.value) and words in str(err.value) and "fix:" in str(err.value)


def test_the_ssh_folder_is_private_and_prefers_a_valid_runtime_dir(tmpdir_env, tmp_path, monkeypatch):
    made = Path(control_path(REMOTE)).parent
    assert made == tmpdir_env / f"hpc-ssh-{os.getuid()}" and stat.S_IMODE(made.stat().st_mode) == 0o700
    runtime = Path(tempfile.mkdtemp(prefix="hpc-run-", dir="/tmp"))  # short, as a socket's path must be
    try:
        monkeypatch.setenv("XDG_RUNTIME_DIR", str(runtime))
        assert Path(control_path(REMOTE)).parent == runtime / "hpc-ssh"
        assert stat.S_IMODE((runtime / "hpc-ssh").stat().st_mode) == 0o700
        plant(runtime)  # a runtime folder that is not ours: not used
        assert Path(control_path(REMOTE)).parent == made
    finally:
        shutil.rmtree(runtime)


def test_the_cli_names_the_planted_ssh_folder_in_one_line_and_exits_2(tmpdir_env, tmp_path):
    folder = plant(tmpdir_env / f"hpc-ssh-{os.getuid()}")
    (tmp_path / "hello.py").write_text("print('hi')\n")
    (tmp_path / "remote.yaml").write_text("name: remote\nextends: slurm-local\nremote:\n  host: 127.0.0.1\n"
                                          "  port: 1\n  job_root: /scratch/me/jobs\n")
    proc = hpc(tmp_path, "submit", "-p", "./remote.yaml", "hello.py",
               env={"TMPDIR": str(tmpdir_env), "XDG_RUNTIME_DIR": ""})
    assert proc.returncode == 2 and str(folder) in one_line(proc.stderr) and "uid 65534" in proc.stderr


# --- 2. a function job's results: signed by the job, checked before unpickling ---------------------------------
@pytest.fixture
def function_job(tmp_path, monkeypatch):
    """A function job's folder and record, as submit leaves them (no scheduler)."""
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path / "xdg-data"))
    folder = jobs.new_job_dir(tmp_path / "out", "fn")
    key = functions.new_key()
    jobs.save(jobs.JobRecord(job_id="7", scheduler="slurm", profile="p", name="fn", job_dir=str(folder),
                             submitted_at=time.time(), argv=[], workdir=str(tmp_path), script="job.sbatch",
                             kind="function", result_key=key))
    (folder / "function").mkdir()
    return folder, key


RESULT = "function/result-0.pkl"


def test_a_signed_result_of_ours_is_read(function_job):
    folder, key = function_job
    (folder / RESULT).write_bytes(functions.sign(key, RESULT, pickle.dumps(("success", 42))))
    assert functions.read_result(LocalFiles(folder), 0) == 42


@pytest.mark.parametrize("forgery,words", [
    ("unsigned", "not signed by the job"),
    ("another key", "not signed by the job"),
    ("rank 1's", "not signed by the job"),  # a genuine result under another rank's name
    ("nobody's", "belongs to uid 65534"),  # signed right, but not our file
    ("a symlink", "symlink"),
])
def test_a_forged_result_is_refused_before_it_is_unpickled(function_job, tmp_path, forgery, words):
    folder, key = function_job
    marker = tmp_path / "the-forged-pickle-ran"
    evil = pickle.dumps(Plant(marker))
    path = folder / RESULT
    if forgery == "unsigned":
        path.write_bytes(evil)
    elif forgery == "another key":
        path.write_bytes(functions.sign(functions.new_key(), RESULT, evil))
    elif forgery == "rank 1's":
        path.write_bytes(functions.sign(key, "function/result-1.pkl", evil))
    elif forgery == "nobody's":
        path.write_bytes(functions.sign(key, RESULT, evil))
        os.chown(path, NOBODY, NOBODY)
    else:
        elsewhere = tmp_path / "elsewhere.pkl"
        elsewhere.write_bytes(functions.sign(key, RESULT, evil))
        path.symlink_to(elsewhere)
    with pytest.raises(HpcError) as err:
        functions.read_result(LocalFiles(folder), 0)
    assert words in one_line(err.value) and not marker.exists()


def _run_function_main(folder: Path, module: str = functions.MODULE) -> subprocess.CompletedProcess:
    env = {**launch_env(), "HPC_JOB_DIR": str(folder), "RANK": "0"}
    return subprocess.run([sys.executable, "-m", module], check=False, env=env, capture_output=True,
                          text=True, timeout=60)


# hpc.functions: the program of function jobs queued before hpc.runtime.function_runner took its place
@pytest.mark.parametrize("module", [functions.MODULE, "hpc.functions"])
def test_the_job_signs_its_result_with_the_key_from_its_private_file(function_job, module):
    from submitit.helpers import DelayedSubmission

    folder, key = function_job
    functions.write_key(folder, key)
    (folder / functions.CALL_FILE).write_bytes(
        functions.sign(key, functions.CALL_FILE, pickle.dumps(DelayedSubmission(abs, -3))))
    proc = _run_function_main(folder, module)
    assert proc.returncode == 0, proc.stderr
    assert stat.S_IMODE((folder / functions.KEY_FILE).stat().st_mode) == 0o600
    assert functions.read_result(LocalFiles(folder), 0) == 3


@pytest.mark.parametrize("problem,words", [
    ("key readable by others", "not this user's alone"),
    ("key of nobody's", "not this user's alone"),
    ("unsigned call", "not signed with the job's key"),
])
def test_the_job_refuses_a_key_or_call_it_cannot_trust(function_job, tmp_path, problem, words):
    folder, key = function_job
    marker = tmp_path / "the-planted-call-ran"
    functions.write_key(folder, key)
    call = pickle.dumps(Plant(marker))
    (folder / functions.CALL_FILE).write_bytes(call if problem == "unsigned call"
                                               else functions.sign(key, functions.CALL_FILE, call))
    if problem == "key readable by others":
        (folder / functions.KEY_FILE).chmod(0o644)
    elif problem == "key of nobody's":
        os.chown(folder / functions.KEY_FILE, NOBODY, NOBODY)
    proc = _run_function_main(folder)
    assert proc.returncode == 2 and words in one_line(proc.stderr) and not marker.exists()


# --- 3. job roots another user owns or may write -----------------------------------------------------------------
@pytest.mark.parametrize("root,words", [
    ("nobody's", "belongs to uid 65534"),
    ("open", "writable by group or others"),
    ("sticky", "writable by group or others"),  # others may add to it: fine above a job root, not for it
    ("in an open folder", "lies in"),
    ("to be made in an open folder", "writable by group or others"),
])
def test_a_job_root_another_user_could_change_is_refused(tmp_path, root, words):
    if root == "nobody's":
        base = plant(tmp_path / "shared", 0o755)
    elif root in ("open", "sticky"):
        base = tmp_path / "shared"
        base.mkdir()
        base.chmod(0o777 if root == "open" else 0o1777)
    else:
        (tmp_path / "open").mkdir()
        (tmp_path / "open").chmod(0o777)
        base = tmp_path / "open" / "mine"
        if root == "in an open folder":
            base.mkdir(mode=0o700)
    existed = base.exists()
    with pytest.raises(HpcError) as err:
        jobs.new_job_dir(base, "train")
    assert words in one_line(err.value) and str(base) in str(err.value)
    assert base.exists() == existed and (not existed or not any(base.iterdir()))  # nothing made in it


def test_job_folders_are_private_whatever_the_umask_and_a_sticky_top_is_fine(tmp_path):
    sticky = tmp_path / "scratch"
    sticky.mkdir()
    sticky.chmod(0o1777)  # like /tmp: everyone may write, no one may rename what is another's
    old = os.umask(0)
    try:
        folder = jobs.new_job_dir(sticky / "me" / "runs", "train")
    finally:
        os.umask(old)
    for made in (folder, folder.parent, folder.parent.parent):
        assert stat.S_IMODE(made.stat().st_mode) == 0o700, made


def test_submit_to_a_planted_output_dir_is_one_line_and_leaves_nothing(tmp_path):
    shared = plant(tmp_path / "shared", 0o777)
    (tmp_path / "train.py").write_text("print('hi')\n")
    proc = hpc(tmp_path, "submit", "-p", "local", "--output-dir", str(shared), "train.py")
    assert proc.returncode == 2 and str(shared) in one_line(proc.stderr) and not any(shared.iterdir())


def _private_job_dir(root: Path, job: Path) -> subprocess.CompletedProcess:
    script = f"umask 000\n{PRIVATE_JOB_DIR}\nprivate_job_dir {shlex.quote(str(root))} {shlex.quote(str(job))}"
    return subprocess.run(["bash", "-c", script], check=False, capture_output=True, text=True, timeout=30)


def test_the_remote_job_root_is_checked_there_and_the_folder_made_private(tmp_path):
    root = tmp_path / "jobs"
    made = _private_job_dir(root, root / "train-1")
    assert made.returncode == 0, made.stderr
    assert stat.S_IMODE(root.stat().st_mode) == stat.S_IMODE((root / "train-1").stat().st_mode) == 0o700
    theirs = plant(tmp_path / "theirs", 0o755)
    refused = _private_job_dir(theirs / "jobs", theirs / "jobs" / "train-2")
    err = Ssh(REMOTE).refusal(refused.stderr)
    assert refused.returncode == 4 and err is not None and "belongs to uid 65534" in one_line(err)
    assert not (theirs / "jobs").exists()  # nothing is made in their folder


# --- 4. job records: checked on load, ids quoted, a bad one skipped in `hpc list` --------------------------------
def record_dict(folder: Path, **changes) -> dict:
    return {"job_id": "12", "scheduler": "local", "profile": "local", "name": "train", "job_dir": str(folder),
            "submitted_at": time.time(), "argv": ["hpc"], "workdir": str(folder), "script": "job.sh", **changes}


def write_record(data_home: Path | None, folder: Path, data, stamp: float = 0) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "record.json").write_text(data if isinstance(data, str) else json.dumps(data))
    if data_home is None:
        return
    index = data_home / "hpc" / "jobs"
    index.mkdir(parents=True, exist_ok=True)
    job_id = data["job_id"] if isinstance(data, dict) else "13"
    (index / f"{job_id}--{stamp:.6f}.json").write_text(json.dumps({"job_dir": str(folder)}))


def test_a_crafted_record_runs_nothing_in_status(tmp_path):
    marker = tmp_path / "the-record-ran-a-command"
    remote = {"host": "127.0.0.1", "port": 1, "job_root": "/scratch/jobs", "env": [f"mkdir {marker}"]}
    crafted = tmp_path / "crafted"
    write_record(None, crafted, record_dict(crafted, job_id=f"1 ; mkdir {marker}", scheduler="slurm", remote=remote))
    proc = hpc(tmp_path, "status", str(crafted))
    assert proc.returncode == 2 and "is not a job id" in one_line(proc.stderr)
    theirs = plant(tmp_path / "theirs", 0o755)  # a well-formed record, but another user's
    (theirs / "record.json").write_text(json.dumps(record_dict(theirs, scheduler="slurm", remote=remote)))
    os.chown(theirs / "record.json", NOBODY, NOBODY)
    proc = hpc(tmp_path, "status", str(theirs))
    assert proc.returncode == 2 and "belongs to uid 65534" in one_line(proc.stderr) and not marker.exists()


def test_list_skips_a_bad_record_with_one_line_naming_it(tmp_path):
    home = tmp_path / "xdg-data"
    good, broken, typed = tmp_path / "good", tmp_path / "broken", tmp_path / "typed"
    write_record(home, good, record_dict(good), 3.0)
    write_record(home, broken, "{not json", 2.0)
    write_record(home, typed, record_dict(typed, job_id="14", array="0-3"), 1.0)
    proc = hpc(tmp_path, "list", "--json")
    assert proc.returncode == 0, proc.stderr
    assert [r["job_id"] for r in json.loads(proc.stdout)] == ["12"]
    skipped = [line for line in proc.stderr.splitlines() if line.startswith("hpc: skipping")]
    assert len(skipped) == 2 and str(broken) in skipped[0] and str(typed) in skipped[1] and "array" in skipped[1]


class LocalShell:
    """Stands for the login node: runs the probe's bash here, with stub SLURM commands that note their argv."""

    label = "login"

    def __init__(self, stubs: Path):
        self.stubs = stubs

    def shell(self, script, timeout=60, check=True, input=None):
        self.script = script
        env = {**os.environ, "PATH": f"{self.stubs}:{os.environ['PATH']}"}
        return subprocess.run(["bash", "-c", script], check=False, capture_output=True, env=env, timeout=timeout,
                              cwd=self.stubs)


def test_ids_reaching_the_login_node_are_quoted_and_the_probe_writes_no_temp_file(tmp_path):
    marker = tmp_path / "the-id-ran-a-command"
    stubs = tmp_path / "stubs"
    stubs.mkdir()
    for name in ("squeue", "sacct"):
        (stubs / name).write_text(f'#!/bin/sh\nprintf "%s\\n" "$@" > {stubs}/{name}.argv\n')
        (stubs / name).chmod(0o755)
    backend = RemoteSlurmBackend(REMOTE)
    backend.ssh = LocalShell(stubs)
    backend._accounting_source = lambda: "dbd"
    crafted = jobs.JobRecord(job_id=f"1;mkdir {marker}", scheduler="slurm", profile="p", name="x",
                             job_dir=str(tmp_path / "j"), submitted_at=0, argv=[], workdir="/", script="job.sbatch")
    backend.collect([crafted])  # not loaded from disk: the quoting itself is what is tested
    assert not marker.exists()
    assert f"1;mkdir {marker}" in (stubs / "squeue.argv").read_text().splitlines()
    assert ">/tmp" not in backend.ssh.script and ".hpc-squeue" not in backend.ssh.script


# --- 5. the code snapshot: no credentials, no links out of the project ------------------------------------------
def test_the_snapshot_leaves_out_credentials_and_links_out_of_the_project(tmp_path, capsys):
    project, outside = tmp_path / "project", tmp_path / "home"
    outside.mkdir()
    (outside / "id_ed25519").write_text("-----BEGIN OPENSSH PRIVATE KEY-----\nsecret\n")
    secrets = {".env": "TOKEN=1", ".netrc": "machine x", "id_rsa": "k", ".git-credentials": "https://u:p@x",
               ".aws/credentials": "[default]", "certs/server.pem": "p", "deploy.key": "k",
               ".docker/config.json": "{}", ".kube/config": "k", ".pypirc": "p", "notes.txt":
               "-----BEGIN RSA PRIVATE KEY-----\n"}
    kept = {"train.py": "print(1)\n", "id_rsa.pub": "ssh-rsa AAAA", "conf/id_map.py": "x = 1\n"}
    for rel, text in {**secrets, **kept}.items():
        (project / rel).parent.mkdir(parents=True, exist_ok=True)
        (project / rel).write_text(text)
    (project / "stolen_key").symlink_to(outside / "id_ed25519")  # a link out of the project
    (project / "alias.py").symlink_to("train.py")  # a link inside it: copied as the file
    subprocess.run(["git", "init", "-q"], cwd=project, check=True)
    subprocess.run(["git", "add", "-f", "-A"], cwd=project, check=True)  # tracked, every one of them
    _, info = snapshot.take(project, tmp_path / "code", exclude_dirs=[])
    copied = sorted(p.relative_to(tmp_path / "code").as_posix() for p in (tmp_path / "code").rglob("*")
                    if p.is_file() or p.is_symlink())
    assert copied == sorted([*kept, "alias.py"])
    assert not (tmp_path / "code" / "alias.py").is_symlink()
    assert info["left_out_count"] == len(secrets) + 1 and "stolen_key" in info["left_out"]
    submission._say_left_out(info)
    said = capsys.readouterr().err
    assert one_line(said).startswith(f"hpc: the code snapshot left out {len(secrets) + 1} file(s)")


# --- 6. job templates: a sandbox, and a note for each built-in one taken over -----------------------------------
def _render_here() -> str:
    effective = precedence.resolve("slurm-local", [precedence.flag_layer({"script": "train.py"})])
    return render(effective, "/scratch/jobs/x", backend=backends.for_profile(effective.profile)).script


def test_a_template_cannot_reach_python(in_tmp):
    marker = in_tmp / "the-template-ran-a-command"
    (in_tmp / "job_templates").mkdir()
    (in_tmp / "job_templates" / "srun.sbatch.j2").write_text(
        f"{{{{ cycler.__init__.__globals__.os.system('mkdir {marker}') }}}}\n")
    with pytest.raises(HpcError) as err:
        _render_here()
    assert "sandbox refused" in one_line(err.value) and not marker.exists()


def test_a_template_taking_a_builtins_place_is_noted_unless_it_is_the_same_text(in_tmp, capsys):
    """A fresh clone beside an installed hpc holds copies of the built-ins: they replace nothing worth a note."""
    before = _render_here()
    (in_tmp / "job_templates").mkdir()
    copied = in_tmp / "job_templates" / "_prelude.j2"
    shutil.copy(builtin_dir("job_templates") / "_prelude.j2", copied)
    assert _render_here() == before
    assert "takes the place" not in capsys.readouterr().err
    copied.write_text(copied.read_text() + "# my site's line\n")
    _render_here()
    notes = [line for line in capsys.readouterr().err.splitlines() if "takes the place" in line]
    assert notes == [f"hpc: note: job template {copied} takes the place of the built-in _prelude.j2"]


def test_a_fresh_clones_own_copies_of_the_builtins_say_nothing(in_tmp):
    """The first run in a clone (an installed hpc, the clone's cluster_configs/ and job_templates/ in the current
    folder) printed four notes about files that are the built-ins themselves."""
    for name in ("cluster_configs", "job_templates"):
        shutil.copytree(builtin_dir(name), in_tmp / name)
        os.chmod(in_tmp / name, 0o755)  # a clone's folders are the user's alone (a group-writable one is ignored)
    (in_tmp / "train.py").write_text("")
    proc = subprocess.run(hpc_cmd("render", "train.py"), cwd=in_tmp, capture_output=True, text=True, timeout=60,
                          env={**os.environ})
    assert proc.returncode == 0 and "note" not in proc.stderr, proc.stderr


def test_a_profile_taking_a_builtins_place_is_noted(in_tmp):
    """`./cluster_configs/local.yaml` used to replace the embedded default without a word."""
    (in_tmp / "cluster_configs").mkdir()
    (in_tmp / "cluster_configs" / "local.yaml").write_text("name: local\nscheduler: local\n")
    (in_tmp / "train.py").write_text("")
    proc = subprocess.run(hpc_cmd("render", "train.py"), cwd=in_tmp, capture_output=True, text=True, timeout=60,
                          env={**os.environ})
    assert proc.returncode == 0, proc.stderr
    mine = in_tmp / "cluster_configs" / "local.yaml"
    assert f"hpc: note: profile {mine} takes the place of the built-in 'local'" in proc.stderr.splitlines()
    (in_tmp / "cluster_configs" / "mine.yaml").write_text("extends: local\n")  # a new name replaces nothing
    proc = subprocess.run(hpc_cmd("render", "-p", "mine", "train.py"), cwd=in_tmp, capture_output=True, text=True,
                          timeout=60, env={**os.environ})
    assert proc.returncode == 0 and "mine.yaml takes the place" not in proc.stderr, proc.stderr


def test_templates_in_a_folder_another_user_owns_are_ignored(in_tmp, capsys):
    (in_tmp / "job_templates").mkdir()
    (in_tmp / "job_templates" / "srun.sbatch.j2").write_text("echo planted\n")
    plant(in_tmp / "job_templates", 0o755)
    assert "planted" not in _render_here()
    assert "ignoring" in capsys.readouterr().err


# --- 8. scripts/slurm-local's state folder ---------------------------------------------------------------------
def _secure_base(state: Path | None, wrap: list[str] | None = None, setup: str = "") -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if not k.startswith("SLURM_LOCAL")}
    if state is not None:
        env["SLURM_LOCAL_DIR"] = str(state)
    # the script is opened before `setup` may mount a /tmp of its own over the checkout (CI's may be under /tmp)
    script = (f'exec 3< {shlex.quote(str(SLURM_LOCAL))}\n{setup}\nsource /dev/fd/3\nsecure_base\n'
              'echo "trusted $BASE"')
    return subprocess.run([*(wrap or []), "bash", "-c", script], check=False, env=env, capture_output=True,
                          text=True, timeout=30)


@pytest.mark.parametrize("kind,words", [
    ("nobody's", "belongs to uid 65534"),
    ("open", "writable by group or others"),
    ("sticky", "writable by group or others"),  # /tmp's sticky bit is fine above it, not for it
    ("symlink", "is a symlink"),
])
def test_slurm_local_refuses_a_state_folder_it_cannot_trust(tmp_path, kind, words):
    state = tmp_path / "hpc-slurm"
    if kind == "nobody's":
        plant(state, 0o755)
    elif kind == "symlink":
        (tmp_path / "real").mkdir()
        state.symlink_to(tmp_path / "real")
    else:
        state.mkdir()
        state.chmod(0o777 if kind == "open" else 0o1777)
    proc = _secure_base(state)
    assert proc.returncode == 1 and "trusted" not in proc.stdout
    assert f"{state} cannot be trusted" in proc.stderr and words in proc.stderr


def test_slurm_local_makes_its_state_folder_root_only_to_write(tmp_path):
    proc = _secure_base(tmp_path / "fresh", setup="umask 000")
    assert proc.returncode == 0 and proc.stdout.strip() == f"trusted {tmp_path / 'fresh'}", proc.stderr
    assert stat.S_IMODE((tmp_path / "fresh").stat().st_mode) == 0o755


def test_slurm_local_refuses_a_planted_default_folder_in_a_private_tmp():
    """The default /tmp/hpc-slurm, planted in a /tmp of its own (the live cluster's is not touched)."""
    plant_it = "mount -t tmpfs -o mode=1777 tmpfs /tmp && mkdir /tmp/hpc-slurm && chown 65534:65534 /tmp/hpc-slurm"
    proc = _secure_base(None, wrap=["unshare", "-m", "--propagation", "private"], setup=plant_it)
    assert proc.returncode == 1 and "/tmp/hpc-slurm cannot be trusted" in proc.stderr, proc.stderr
    assert "belongs to uid 65534" in proc.stderr
