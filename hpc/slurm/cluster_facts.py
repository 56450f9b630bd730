"""What a SLURM cluster says about itself: its partitions, their nodes, its config, and (where slurmdbd answers)
what the user may charge and use. Read through ``Slurm`` (hpc.slurm.commands), here or on the login node.

Only what SLURM states is kept; what it does not say stays None, so a profile written from these facts never
holds a guess (``hpc profile new --detect``), and ``hpc profile check`` compares a profile with them.
"""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass, field

from hpc.errors import HpcError
from hpc.slurm import formats
from hpc.slurm.commands import QosInfo, Slurm, parse_gres

UNSET = ("", "(null)", "N/A", "NONE", "None", "UNLIMITED", "INFINITE")
# addresses sampled to find the nodes' network: a getent call with thousands of names is slow and long
MAX_ADDRESSES = 256


@dataclass
class Node:
    name: str
    address: str
    cpus: int | None
    memory_mb: int | None
    gpus: int
    gpu_type: str | None
    features: frozenset[str]
    partitions: tuple[str, ...]


@dataclass
class Partition:
    name: str
    default: bool
    state: str
    total_nodes: int | None
    max_nodes: int | None  # MaxNodes; None: UNLIMITED
    max_time: str | None  # as SLURM spells it; None: UNLIMITED
    default_time: str | None  # None: NONE (SLURM then gives a job MaxTime)
    preempt_mode: str  # OFF, REQUEUE, CANCEL, SUSPEND,GANG ...
    grace_time: int  # seconds a preempted job is given after its TERM
    qos: str | None  # the partition's own QOS
    nodes: list[Node] = field(default_factory=list)

    def fewest(self, attr: str) -> int | None:
        """What every node of the partition has at least (its smallest node's), None if a node does not say."""
        values = [getattr(n, attr) for n in self.nodes]
        return min(values) if values and None not in values else None

    def most(self, attr: str) -> int | None:
        values = [getattr(n, attr) for n in self.nodes if getattr(n, attr) is not None]
        return max(values) if values else None

    def gpu_type(self) -> str | None:
        """The GPU type all its nodes share, or None (untyped, or more than one)."""
        types = {n.gpu_type for n in self.nodes}
        return types.pop() if len(types) == 1 else None

    def common_features(self) -> list[str]:
        if not self.nodes:
            return []
        return sorted(frozenset.intersection(*(n.features for n in self.nodes)))

    def all_features(self) -> list[str]:
        return sorted(frozenset().union(*(n.features for n in self.nodes))) if self.nodes else []

    @property
    def max_time_s(self) -> int | None:
        return formats.parse_time(self.max_time) if self.max_time else None


@dataclass
class Access:
    """What slurmdbd says the user may use."""

    user: str
    default_account: str | None
    accounts: list[str]  # in slurmdbd's order, the default first when it is among them
    qos: list[str]  # QOS allowed on the partition's associations
    default_qos: str | None
    # every QOS of the cluster: with PreemptType=preempt/qos they decide whose jobs are preempted, and how
    all_qos: dict[str, QosInfo] = field(default_factory=dict)


@dataclass
class ClusterFacts:
    cluster_name: str | None
    preempt_type: str  # preempt/none, preempt/partition_prio, preempt/qos
    preempt_mode: str  # the cluster's PreemptMode, what a QOS's "cluster" stands for
    max_array_size: int | None
    select_type: str | None  # select/cons_tres knows --gpus-per-node; select/cons_res only --gres
    accounting: bool  # slurmdbd keeps accounting: sacctmgr can answer
    partitions: dict[str, Partition]
    access: Access | None = None  # None: no slurmdbd, or it did not answer
    interface: tuple[str, str] | None = None  # (interface, its network) holding every node's address

    def partition(self, name: str | None) -> Partition | None:
        if name is None:
            return next((p for p in self.partitions.values() if p.default), None)
        return self.partitions.get(name)


def _int(value: str | None) -> int | None:
    return int(value) if value and value.isdigit() else None


def _set(value: str | None) -> str | None:
    return None if value is None or value in UNSET else value


def _node(record: dict[str, str]) -> Node:
    gres = parse_gres(record.get("Gres", ""))
    gpu_type, gpus = gres.get("gpu", (None, 0))
    features = _set(record.get("AvailableFeatures"))
    return Node(name=record.get("NodeName", ""), address=record.get("NodeAddr") or record.get("NodeName", ""),
                cpus=_int(record.get("CPUTot")), memory_mb=_int(record.get("RealMemory")), gpus=gpus,
                gpu_type=gpu_type, features=frozenset(f for f in (features or "").split(",") if f),
                partitions=tuple(p for p in (_set(record.get("Partitions")) or "").split(",") if p))


def _partition(record: dict[str, str], nodes: list[Node]) -> Partition:
    name = record.get("PartitionName", "")
    return Partition(name=name, default=record.get("Default") == "YES", state=record.get("State", "UP"),
                     total_nodes=_int(record.get("TotalNodes")), max_nodes=_int(record.get("MaxNodes")),
                     max_time=_set(record.get("MaxTime")), default_time=_set(record.get("DefaultTime")),
                     preempt_mode=record.get("PreemptMode", "OFF"), grace_time=_int(record.get("GraceTime")) or 0,
                     qos=_set(record.get("QoS")), nodes=[n for n in nodes if name in n.partitions])


def gather(slurm: Slurm, partition: str | None = None) -> ClusterFacts:
    """The cluster's facts; sacctmgr and the network only for ``partition`` (the default one when None)."""
    conf = slurm.config()
    nodes = [_node(r) for r in slurm.show_records("node")]
    partitions = {p.name: p for p in (_partition(r, nodes) for r in slurm.show_records("partition"))}
    facts = ClusterFacts(cluster_name=_set(conf.get("ClusterName")),
                         preempt_type=conf.get("PreemptType", "preempt/none"),
                         preempt_mode=conf.get("PreemptMode", "OFF"),
                         max_array_size=_int(conf.get("MaxArraySize")), select_type=_set(conf.get("SelectType")),
                         accounting=conf.get("AccountingStorageType") == "accounting_storage/slurmdbd",
                         partitions=partitions)
    chosen = facts.partition(partition)
    if chosen is None:
        return facts
    if facts.accounting:
        facts.access = _access(slurm, chosen)
    facts.interface = _interface(slurm, chosen)
    return facts


def _access(slurm: Slurm, partition: Partition) -> Access | None:
    user = slurm.login_user()
    rows = slurm.associations(user) if user else None
    if user is None or rows is None:
        return None
    # an association names a partition, or none (then it holds for all)
    rows = [r for r in rows if r.get("partition") in ("", partition.name)]
    default_account = slurm.default_account(user)
    accounts = list(dict.fromkeys(r["account"] for r in rows if r.get("account")))
    if default_account in accounts:
        accounts.remove(default_account)
        accounts.insert(0, default_account)
    qos = sorted({q for r in rows for q in r.get("qos", "").split(",") if q})
    defaults = {r["default_qos"] for r in rows if r.get("default_qos")}
    access = Access(user=user, default_account=default_account, accounts=accounts, qos=qos,
                    default_qos=defaults.pop() if len(defaults) == 1 else None)
    access.all_qos = {q.name: q for q in slurm.qos() or []}
    return access


def _interface(slurm: Slurm, partition: Partition) -> tuple[str, str] | None:
    """The interface of the machine SLURM's clients run on whose network holds every node's address (NodeAddr):
    the network the nodes share. None if the nodes' addresses are not all known or span networks."""
    nodes = partition.nodes[:MAX_ADDRESSES]
    if not nodes:
        return None
    literal, names = {}, []
    for node in nodes:
        try:
            literal[node.name] = ipaddress.ip_address(node.address)
        except ValueError:
            names.append(node.address)
    try:
        resolved = slurm.addresses(sorted(set(names))) if names else {}
        networks = slurm.networks()
    except HpcError:
        return None
    if networks is None:
        return None
    addresses = list(literal.values())
    for name in names:
        if name not in resolved:
            return None
        addresses.append(ipaddress.ip_address(resolved[name]))
    found = set()
    for address in addresses:
        holders = {(iface, str(ipaddress.ip_interface(cidr).network)) for iface, cidr in networks
                   if address in ipaddress.ip_interface(cidr).network}
        if len(holders) != 1:
            return None
        found |= holders
    return found.pop() if len(found) == 1 else None
