"""An elastic torchrun job's c10d rendezvous timeouts: hpc's defaults (seconds, not torch's 30 s last call and 15 s
heartbeat), the profile's `rendezvous` section, the job keys rdzv_* over it, and the rendered PET_RDZV_CONF that
carries them beside is_host. The node loss they shorten is measured in tests/test_elastic_slurm.py."""

import re
import textwrap

import pytest

from hpc.cluster import backends
from hpc.cluster.config import precedence as p
from hpc.cluster.config import profiles
from hpc.cluster.render import render
from hpc.contract import launch_settings
from hpc.errors import ConfigError

ELASTIC = {"launcher": "torchrun", "elastic": "1:2", "max_restarts": 3}


def _resolve(profile="slurm-local", flags=None, env=None, sets=None):
    layers = [p.env_layer(env or {})]
    if sets:
        layers.append(p.set_layer(sets))
    layers.append(p.flag_layer({"script": "train.py", **(flags or {})}))
    return p.resolve(profile, layers)


def _conf(script: str) -> dict[str, str]:
    """The node's PET_RDZV_CONF, parsed as torch parses --rdzv_conf (torch.distributed.elastic.rendezvous.utils.
    _parse_rendezvous_config: comma-separated key=value)."""
    (value,) = re.findall(r"export PET_RDZV_CONF=([^; ]*);", script)
    return dict(kv.split("=", 1) for kv in value.split(","))


def _script(**kw) -> str:
    effective = _resolve(**kw)
    return render(effective, "/scratch/jobs/r", backend=backends.for_profile(effective.profile)).script


def _profile(in_tmp, body: str) -> str:
    path = in_tmp / "cluster_configs" / "site.yaml"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("extends: slurm-local\nname: site\n" + textwrap.dedent(body))
    return "site"


def test_an_elastic_job_renders_hpcs_rendezvous_defaults_beside_is_host(in_tmp):
    conf = _conf(_script(flags=ELASTIC))
    assert conf == {"is_host": "$is_host", "join_timeout": "600", "last_call_timeout": "3",
                    "keep_alive_interval": "1", "keep_alive_max_attempt": "3"}
    # a dead node's heartbeat is stale after 3 s, and the new round waits 3 s more: seconds, not torch's 45
    rdzv = launch_settings.Rendezvous()
    assert rdzv.keep_alive_interval * rdzv.keep_alive_max_attempt + rdzv.last_call_timeout <= 10


def test_a_job_that_is_not_elastic_keeps_torchs_rendezvous(in_tmp):
    """All of its nodes go on or none do: the timeouts never hold it up, and a 1 s heartbeat would only load the
    store."""
    assert _conf(_script(flags={"launcher": "torchrun", "nodes": 2})) == {"is_host": "$is_host"}


def test_each_value_comes_from_the_highest_layer_and_explain_names_it(in_tmp):
    name = _profile(in_tmp, "rendezvous:\n  last_call_timeout: 5\n  keep_alive_max_attempt: 4\n")
    eff = _resolve(name, flags={**ELASTIC}, env={"HPC_RDZV_KEEP_ALIVE_MAX_ATTEMPT": "6"},
                   sets=["rdzv_join_timeout=900"])
    job, src = eff.job, eff.sources
    assert (job.rdzv_last_call_timeout, src["rdzv_last_call_timeout"]) == (5, "profile site.yaml")
    assert (job.rdzv_keep_alive_max_attempt, src["rdzv_keep_alive_max_attempt"]) == (
        6, "env (HPC_RDZV_KEEP_ALIVE_MAX_ATTEMPT)")
    assert (job.rdzv_join_timeout, src["rdzv_join_timeout"]) == (900, "--set (--set rdzv_join_timeout)")
    # a key the profile's section does not say is the default, not the profile's
    assert (job.rdzv_keep_alive_interval, src.get("rdzv_keep_alive_interval", "default")) == (1, "default")
    rows = {r[0]: r[2] for r in eff.explain_rows()}
    assert rows["rdzv_last_call_timeout"] == "profile site.yaml" and rows["rdzv_keep_alive_interval"] == "default"
    conf = _conf(render(eff, "/scratch/jobs/r", backend=backends.for_profile(eff.profile)).script)
    assert (conf["last_call_timeout"], conf["keep_alive_max_attempt"], conf["join_timeout"]) == ("5", "6", "900")


def test_the_section_merges_along_extends_and_names_each_keys_file(in_tmp):
    d = in_tmp / "cluster_configs"
    d.mkdir()
    (d / "base.yaml").write_text("extends: slurm-local\nname: base\nrendezvous: {last_call_timeout: 7}\n")
    (d / "leaf.yaml").write_text("extends: base\nname: leaf\nrendezvous: {keep_alive_interval: 2}\n")
    prof, _, origin = profiles.load("leaf")
    assert (prof.rendezvous.last_call_timeout, prof.rendezvous.keep_alive_interval) == (7, 2)
    assert origin["rendezvous.last_call_timeout"].name == "base.yaml"
    assert origin["rendezvous.keep_alive_interval"].name == "leaf.yaml"
    src = _resolve("leaf", flags=ELASTIC).sources
    assert (src["rdzv_last_call_timeout"], src["rdzv_keep_alive_interval"]) == ("profile base.yaml",
                                                                                "profile leaf.yaml")


@pytest.mark.parametrize("body, key, problem", [
    ("rendezvous: {last_call: 3}\n", "rendezvous.last_call", "did you mean 'last_call_timeout'"),
    ("rendezvous: {keep_alive_interval: 0.5}\n", "rendezvous.keep_alive_interval", "must be an integer"),
    ("rendezvous: {keep_alive_max_attempt: 0}\n", "rendezvous.keep_alive_max_attempt", "must be at least 1"),
    ("rendezvous: {last_call_timeout: '3; id'}\n", "rendezvous.last_call_timeout", "must be an integer"),
    ("rendezvous: {last_call_timeout: 60, join_timeout: 60}\n", "rendezvous.last_call_timeout",
     "not shorter than rendezvous.join_timeout"),
    ("rendezvous: 3\n", "rendezvous", "must be a mapping"),
])
def test_a_bad_section_is_one_line_naming_file_key_and_fix(in_tmp, body, key, problem):
    path = in_tmp / "bad.yaml"
    path.write_text(body)
    with pytest.raises(ConfigError) as err:
        profiles.load(str(path))
    msg = str(err.value)
    assert err.value.key == key and str(path) in msg and problem in msg and "fix:" in msg and "\n" not in msg


@pytest.mark.parametrize("flags, env, sets, key, problem", [
    ({}, {"HPC_RDZV_LAST_CALL_TIMEOUT": "$(id)"}, None, "HPC_RDZV_LAST_CALL_TIMEOUT", "must be an integer"),
    ({}, {}, ["rdzv_keep_alive_interval=0"], "--set rdzv_keep_alive_interval", "must be at least 1"),
    ({}, {}, ["rdzv_last_call_timeout=600"], "--set rdzv_last_call_timeout", "not shorter than rdzv_join_timeout"),
])
def test_a_bad_job_value_is_one_line_naming_where_it_was_set(in_tmp, flags, env, sets, key, problem):
    with pytest.raises(ConfigError) as err:
        _resolve(flags={**ELASTIC, **flags}, env=env, sets=sets)
    assert err.value.key == key and problem in str(err.value) and "\n" not in str(err.value)
