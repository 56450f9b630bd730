"""A profile from what the cluster says about itself (``hpc profile new --detect``), and a profile held against
it (``hpc profile check``).

Each detected value carries where it came from, written as a comment above its key; what SLURM does not state is
left out, never guessed (the profile's defaults, or the user's flags, then apply).
"""

from __future__ import annotations

import textwrap
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from hpc.errors import HpcError
from hpc.slurm import formats
from hpc.slurm.cluster_facts import ClusterFacts, Partition

COMMENT_WIDTH = 110
HPC_DEFAULT_TIME = "01:00:00"  # ClusterProfile's default_time, which must stay within a detected max_time
# flag key -> the profile key it sets (the preemption flags go under preemption:)
FLAG_KEYS = {"signal": "preemption.signal", "lead_time": "preemption.lead_time"}
# questions the cluster answers, or says have no answer (MaxTime=UNLIMITED, nodes without GPUs): never asked
# with --detect; a flag still sets them
ANSWERED_BY_CLUSTER = {"scheduler", "partition", "gpus_per_node", "tasks_per_node", "cpus_per_task", "max_time"}


@dataclass
class Detected:
    key: str
    value: object
    source: str  # where the value came from, as the comment above it says


def limit_nodes(p: Partition) -> tuple[int, str] | None:
    """The most nodes a job of partition ``p`` may get, and the setting that says so (``TotalNodes=4``)."""
    limits = [(v, f"{k}={v}") for k, v in (("MaxNodes", p.max_nodes), ("TotalNodes", p.total_nodes)) if v]
    return min(limits) if limits else None


def _plural(n: int, word: str) -> str:
    return f"{n} {word}{'' if n == 1 else 's'}"


def detect(facts: ClusterFacts, partition: Partition, gpus_per_node: int | None = None,
           qos: str | None = None) -> list[Detected]:
    """The profile's values that the cluster states, in the order a profile lists them. ``gpus_per_node``, ``qos``:
    the user's own (flags), which the node's CPUs are then shared by, and whose preemption is read."""
    p = partition
    out = [Detected("partition", p.name,
                    "the cluster's default partition (Default=YES)" if p.default
                    else "the partition asked for (--partition)")]
    if facts.access is not None:
        a = facts.access
        account = a.default_account if a.default_account in a.accounts else (a.accounts[0] if a.accounts else None)
        if account:
            others = [x for x in a.accounts if x != account]
            said = (f"{a.user}'s default account (sacctmgr show user)" if account == a.default_account else
                    f"an account {a.user} may use on {p.name} (sacctmgr show associations)"
                    + (f"; the default, {a.default_account}, is not one" if a.default_account else ""))
            out.append(Detected("account", account, said + (f"; also allowed: {', '.join(others)}" if others else "")))
        if a.default_qos:
            others = [q for q in a.qos if q != a.default_qos]
            out.append(Detected("qos", a.default_qos, f"{a.user}'s default QOS (sacctmgr show associations)"
                                + (f"; also allowed: {', '.join(others)}" if others else "")))
    features = p.common_features()
    if features:
        out.append(Detected("constraint", "&".join(features),
                            f"features every node of {p.name} has (AvailableFeatures)"
                            + _other_features(p, features)))
    nodes = limit_nodes(p)
    if nodes:
        out.append(Detected("max_nodes", nodes[0], f"partition {p.name}: {nodes[1]} (scontrol show partition)"))
    if facts.max_array_size:
        out.append(Detected("max_array_size", facts.max_array_size, "MaxArraySize (scontrol show config)"))
    gpus, cpus = p.fewest("gpus"), p.fewest("cpus")
    if gpus:
        spread = "" if gpus == p.most("gpus") else f" (its smallest node; some have {p.most('gpus')})"
        out.append(Detected("gpus_per_node", gpus, f"GPUs (GRES gpu) on each node of {p.name}{spread}"))
        if p.gpu_type():
            out.append(Detected("gpu_type", p.gpu_type(), f"the GRES type of {p.name}'s GPUs"))
        if facts.select_type == "select/cons_res":
            out.append(Detected("gres_style", "gres", "SelectType=select/cons_res knows no --gpus-per-node"))
        used = gpus_per_node or gpus
        if cpus and cpus >= used:
            out.append(Detected("cpus_per_task", cpus // used,
                                f"{_plural(cpus, 'CPU')} (CPUTot) of {p.name}'s smallest node shared by "
                                + (f"the {_plural(used, 'GPU')} asked for" if used != gpus
                                   else f"its {_plural(gpus, 'GPU')}")))
    elif gpus == 0 and cpus:
        out.append(Detected("tasks_per_node", cpus,
                            f"no GPUs: one process per CPU of {p.name}'s smallest node (CPUTot={cpus})"))
        out.append(Detected("cpus_per_task", 1, "one CPU each"))
    if p.default_time:
        out.append(Detected("default_time", p.default_time,
                            f"partition {p.name}: DefaultTime (scontrol show partition)"))
    elif p.max_time_s is not None and p.max_time_s < formats.parse_time(HPC_DEFAULT_TIME):
        out.append(Detected("default_time", p.max_time,
                            f"partition {p.name} has no DefaultTime: SLURM gives a job MaxTime, below hpc's "
                            f"{HPC_DEFAULT_TIME}"))
    if p.max_time:
        out.append(Detected("max_time", p.max_time, f"partition {p.name}: MaxTime (scontrol show partition)"))
    if facts.interface:
        iface, network = facts.interface
        out.append(Detected("network_interface", iface,
                            f"the nodes' addresses (NodeAddr) are on {network}, the network of {iface} where "
                            "SLURM's clients run (ip addr)"))
    mode, grace, said = preemption(facts, p, qos)
    if grace and not mode.upper().startswith("OFF"):
        out.append(Detected("preemption.lead_time", grace,
                            f"{said}: a preempted job's tasks get TERM and {grace} s to save; the same save must fit "
                            "before the time limit"))
    else:
        out.append(Detected("", None, preemption_note(facts, p, qos)))
    return out


def preemption(facts: ClusterFacts, p: Partition, qos: str | None = None) -> tuple[str, int, str]:
    """(PreemptMode, GraceTime s, where that was read) of jobs in partition ``p`` (and QOS ``qos``, else the
    user's default one) as the user would run them; mode OFF: never preempted."""
    if facts.preempt_type == "preempt/none":
        return "OFF", 0, "PreemptType=preempt/none"
    if facts.preempt_type == "preempt/qos":
        a = facts.access
        qos = qos or (a.default_qos if a else None)
        if a is None or qos not in a.all_qos:
            return "OFF", 0, "PreemptType=preempt/qos, the QOS unknown"
        info = a.all_qos[qos]
        by = sorted(q.name for q in a.all_qos.values() if qos in q.preempts)
        if not by:
            return "OFF", 0, f"QOS {qos} (sacctmgr show qos): no QOS preempts it"
        mode = facts.preempt_mode if info.preempt_mode.lower() in ("", "cluster") else info.preempt_mode.upper()
        grace = info.grace_time or 0
        return mode, grace, f"QOS {qos}: PreemptMode={mode} GraceTime={grace}, preempted by {', '.join(by)}"
    return p.preempt_mode, p.grace_time, f"partition {p.name}: PreemptMode={p.preempt_mode} GraceTime={p.grace_time}"


def preemption_note(facts: ClusterFacts, p: Partition, qos: str | None = None) -> str:
    """A comment line on preemption, also when there is nothing to set."""
    mode, grace, said = preemption(facts, p, qos)
    if mode.upper().startswith("OFF"):
        return f"{said}: jobs here are not preempted; only the time limit stops them"
    if not grace:
        return f"{said}: a preempted job is killed at once (no time to save); it resumes from its last checkpoint"
    return f"{said}"


def _other_features(p: Partition, common: list[str]) -> str:
    rest = [f for f in p.all_features() if f not in common]
    return f"; some nodes also have: {', '.join(rest)}" if rest else ""


def render(header: str, entries: list[Detected]) -> str:
    """The profile as YAML with each value's source as a comment above it. Dotted keys (``preemption.lead_time``)
    go under their mapping; a mapping value (``remote``) is written whole under its comment; an empty key is a
    comment line alone."""
    import yaml

    def dump(key: str, value, indent: str) -> list[str]:
        text = yaml.safe_dump({key: value}, sort_keys=False, default_flow_style=False, width=1000)
        return [indent + line for line in text.splitlines()]

    def comment(source: str, indent: str) -> list[str]:
        return [f"{indent}# {line}" for line in textwrap.wrap(source, COMMENT_WIDTH - len(indent))]

    blocks: dict[str, list[str]] = {}  # top-level key -> its lines, in the order first seen
    for n, e in enumerate(entries):
        top, _, child = e.key.partition(".")
        if not top:  # a note: a comment of its own
            blocks[f"#{n}"] = comment(e.source, "")
        elif child:
            block = blocks.setdefault(top, [f"{top}:"])
            block += comment(e.source, "  ") + dump(child, e.value, "  ")
        else:
            blocks[top] = comment(e.source, "") + dump(top, e.value, "")
    return "\n".join([*comment(header, ""), *(line for b in blocks.values() for line in b)]) + "\n"


def live_slurm(remote):
    """A Slurm that asks the cluster, and where: over SSH through ``remote`` (a profile's), else this machine's
    clients."""
    from hpc.slurm.commands import Slurm, require_conf

    if remote is not None:
        from hpc.cluster.ssh import Ssh

        ssh = Ssh(remote)
        return Slurm(run=ssh.run), f"over SSH to {ssh.label}"
    require_conf()
    return Slurm(), "here"


def detected_text(name: str, given: dict, remote_ref: str | None = None, questions: Iterable[str] = (),
                  ask: Callable[[str], object] | None = None) -> str:
    """The new profile's YAML from the live cluster, with ``given`` (the flags) over what was detected.
    ``questions``: keys, in order, to ``ask`` the user for where neither the cluster nor a flag says them; an
    empty answer leaves the key out."""
    from hpc.cluster.config import profiles
    from hpc.contract.validate import to_plain
    from hpc.slurm.cluster_facts import gather

    if given.get("scheduler") == "local":
        raise HpcError("--detect reads a SLURM cluster; --scheduler local has nothing to detect",
                       fix="drop --scheduler local, or drop --detect")
    remote = None
    if remote_ref:
        prof, _, _ = profiles.load(remote_ref)
        if prof.remote is None:
            raise HpcError(f"profile {prof.name} has no remote (login node) to detect through",
                           fix="name a profile with a remote: block, or run on the login node without --remote")
        remote = prof.remote
    slurm, where = live_slurm(remote)
    facts = gather(slurm, given.get("partition"))
    partition = facts.partition(given.get("partition"))
    if partition is None:
        names = ", ".join(facts.partitions) or "none"
        if given.get("partition"):
            raise HpcError(f"partition {given['partition']!r} does not exist on this cluster (partitions: {names})",
                           fix="give one of them with --partition")
        raise HpcError(f"the cluster has no default partition (partitions: {names})",
                       fix="choose one with --partition")
    entries = [Detected("name", name, ""), Detected("scheduler", "slurm", "")]
    entries += detect(facts, partition, given.get("gpus_per_node"), given.get("qos"))
    if remote is not None:
        settings = {k: v for k, v in to_plain(remote).items() if v not in (None, [], {})}
        entries.append(Detected("remote", settings, f"the login node of profile {remote_ref}"))
    found = _flags_over(entries, given)
    for key in questions:  # what the cluster cannot say (modules, launcher, ...)
        target = FLAG_KEYS.get(key, key)
        if key in ANSWERED_BY_CLUSTER or target in found or given.get(key) not in (None, ""):
            continue
        answer = ask(key)
        if answer not in ("", 0, None):
            entries.append(Detected(target, _modules(answer) if key == "modules" else answer, "your answer"))
    asked = "scontrol show partition/node/config" + (", sacctmgr" if facts.access is not None else "")
    header = (f"Written by `hpc profile new --detect` from what SLURM cluster {facts.cluster_name or '?'} said "
              f"about itself ({where}: {asked}). The line above each value says where it came from; what SLURM "
              f"does not state is left out. `hpc profile check {name}` holds it against the cluster again.")
    return render(header, entries)


def _modules(text: str) -> list[str]:
    return [m.strip() for m in text.split(",") if m.strip()]


def _flags_over(entries: list[Detected], given: dict) -> dict[str, Detected]:
    """``given`` (the flags) in place of what was detected, each noting what the cluster said where they differ;
    ``entries`` changed in place. Returns every entry by its key."""
    found = {e.key: e for e in entries}
    for key, value in given.items():
        if value in (None, "") or key in ("scheduler", "partition"):
            continue
        target = FLAG_KEYS.get(key, key)
        if key == "modules":
            value = _modules(value)
        flag = f"--{key.replace('_', '-')}"
        was = found.get(target)
        note = f"{flag}; the cluster says {was.value} ({was.source})" if was and was.value != value else flag
        replacement = Detected(target, value, note)
        if was:
            entries[entries.index(was)] = replacement
        else:
            entries.append(replacement)
        found[target] = replacement
    return found
