import textwrap

import pytest

from hpc.cluster.config import profiles
from hpc.errors import ConfigError, HpcError


def write(path, text):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(textwrap.dedent(text))
    return path


@pytest.mark.parametrize("name", [n for n, _ in profiles.available()])
def test_every_shipped_profile_is_valid(name):
    prof, path, _ = profiles.load(name)
    assert prof.name == name and path.is_file()


def test_extends_several_levels_merges_mappings(in_tmp):
    d = in_tmp / "cluster_configs"
    write(d / "base.yaml", """
        name: base
        partition: cpu
        env: {A: "1", B: "2"}
        preemption: {signal: USR2, lead_time: 60}
        modules: [gcc]
    """)
    write(d / "mid.yaml", """
        extends: base
        name: mid
        env: {B: "20"}
        modules: [cuda]
    """)
    write(d / "leaf.yaml", """
        extends: mid
        name: leaf
        preemption: {lead_time: 30}
    """)
    prof, path, origin = profiles.load("leaf")
    assert prof.partition == "cpu"
    assert prof.env == {"A": "1", "B": "20"}          # mappings merge key by key
    assert prof.modules == ["cuda"]                   # lists replace
    assert (prof.preemption.signal, prof.preemption.lead_time) == ("USR2", 30)
    assert origin["partition"].name == "base.yaml" and origin["modules"].name == "mid.yaml"


def test_error_in_a_parent_names_the_parent_file(in_tmp):
    d = in_tmp / "cluster_configs"
    write(d / "base.yaml", "name: base\ngpus_per_node: lots\n")
    write(d / "child.yaml", "extends: base\nname: child\n")
    with pytest.raises(ConfigError) as err:
        profiles.load("child")
    assert err.value.source.endswith("base.yaml") and err.value.key == "gpus_per_node"


def test_extends_cycle_is_reported(in_tmp):
    d = in_tmp / "cluster_configs"
    write(d / "a.yaml", "extends: b\n")
    write(d / "b.yaml", "extends: c\n")
    write(d / "c.yaml", "extends: a\n")
    with pytest.raises(HpcError, match="cycle: .*a.yaml -> .*b.yaml -> .*c.yaml -> .*a.yaml"):
        profiles.load("a")


def test_extends_a_missing_parent(in_tmp):
    write(in_tmp / "cluster_configs" / "a.yaml", "extends: nowhere\n")
    with pytest.raises(ConfigError, match="extends = 'nowhere': names no profile"):
        profiles.load("a")


@pytest.mark.parametrize("body, key, problem", [
    ("partiton: gpu\n", "partiton", "did you mean 'partition'"),
    ("gpus_per_node: '4'\n", "gpus_per_node", "must be an integer"),
    ("gpus_per_node: -1\n", "gpus_per_node", "must not be negative"),
    ("scheduler: pbs\n", "scheduler", "must be one of slurm, local"),
    ("launcher: torchrn\n", "launcher", "did you mean 'torchrun'"),
    ("modules: gcc\n", "modules", "must be a list"),
    ("env: {HF_TOKEN: abc}\n", "env", "looks like a secret"),
    ("env: {'A B': x}\n", "env", "not an environment variable name"),
    ("mem: 4G\nmem_per_gpu: 1G\n", "mem_per_gpu", "cannot be set together with mem"),
    ("default_time: '2:00:00'\nmax_time: '1:00:00'\n", "default_time", "exceeds max_time"),
    ("sbatch_extra: ['--mail-user=a b']\n", "sbatch_extra", "--key[=value]"),
    ("sbatch_extra: ['--x=$(id)']\n", "sbatch_extra", "--key[=value]"),
    ("preemption: {signal: KILL}\n", "preemption.signal", "not a signal"),
    ("preemption: {sginal: USR1}\n", "preemption.sginal", "did you mean 'signal'"),
    ("container: {runtime: docker, image: x}\n", "container.runtime", "must be one of apptainer, pyxis"),
    ("container: {runtime: pyxis}\n", "container.image", "is required"),
    ("partition: 'gpu;rm -rf /'\n", "partition", "characters SLURM values cannot have"),
    ("max_time: forever\n", "max_time", "not a SLURM duration"),
])
def test_bad_profiles_name_file_key_and_fix(in_tmp, body, key, problem):
    path = write(in_tmp / "bad.yaml", body)
    with pytest.raises(ConfigError) as err:
        profiles.load(str(path))
    msg = str(err.value)
    assert err.value.key == key and str(path) in msg and problem in msg and "fix:" in msg and "\n" not in msg


def test_invalid_yaml_names_the_line(in_tmp):
    path = write(in_tmp / "bad.yaml", "name: x\npartition: [unclosed\n")
    with pytest.raises(HpcError, match=r"bad.yaml:\d+: not valid YAML"):
        profiles.load(str(path))


def test_search_order_project_then_user_then_builtin(in_tmp):
    builtin, _, _ = profiles.load("slurm-local")
    assert builtin.partition == "debug"
    write(in_tmp / "xdg" / "hpc" / "cluster_configs" / "slurm-local.yaml", "partition: user\n")
    assert profiles.load("slurm-local")[0].partition == "user"
    write(in_tmp / "cluster_configs" / "slurm-local.yaml", "partition: project\n")
    assert profiles.load("slurm-local")[0].partition == "project"
    # an explicit path beats every name lookup
    other = write(in_tmp / "elsewhere" / "slurm-local.yaml", "partition: explicit\n")
    assert profiles.load(str(other))[0].partition == "explicit"


def test_a_profile_can_extend_the_builtin_of_the_same_name(in_tmp):
    write(in_tmp / "cluster_configs" / "site.yaml", "extends: perlmutter\nname: site\naccount: m1234\n")
    prof, _, _ = profiles.load("site")
    assert prof.account == "m1234" and prof.gpus_per_node == 4 and prof.constraint == "gpu"


def test_every_scheduler_a_profile_may_name_has_a_backend_and_no_other():
    """Records are checked against the profile's schedulers without loading the backends: the two lists agree."""
    from hpc.cluster import backends
    from hpc.cluster.config.schema import SCHEDULERS

    assert sorted(SCHEDULERS) == backends.names()
