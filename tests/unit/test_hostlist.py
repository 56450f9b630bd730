import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hpc.errors import HpcError
from hpc.slurm.hostlist import compress, expand


@pytest.mark.parametrize("text, hosts", [
    ("node1", ["node1"]),
    ("node[1-3]", ["node1", "node2", "node3"]),
    # as scontrol: each range keeps its own width
    ("node[001-004,7]", ["node001", "node002", "node003", "node004", "node7"]),
    ("a[01-3]", ["a01", "a02", "a03"]),
    ("node[001-004,7],gpu-a[1-2]", ["node001", "node002", "node003", "node004", "node7", "gpu-a1", "gpu-a2"]),
    ("node[8-11]", ["node8", "node9", "node10", "node11"]),
    ("rack[1-2]-n[01-02]", ["rack1-n01", "rack1-n02", "rack2-n01", "rack2-n02"]),
    ("login,node1.ib", ["login", "node1.ib"]),
    ("", []),
])
def test_expand(text, hosts):
    assert expand(text) == hosts


@pytest.mark.parametrize("hosts, text", [
    (["node1", "node2", "node3"], "node[1-3]"),
    (["node001", "node002", "node004"], "node[001-002,004]"),
    (["node3", "node1", "node1"], "node[1,3]"),
    (["a1", "b", "a2"], "b,a[1-2]"),
    (["n1.ib", "n2.ib"], "n1.ib,n2.ib"),  # SLURM cannot write n[1-2].ib
    (["node9", "node10"], "node[9-10]"),
    (["gpu7"], "gpu7"),
])
def test_compress(hosts, text):
    assert compress(hosts) == text


@pytest.mark.parametrize("bad", ["node[1-", "node]1[", "node[3-1]", "node[a-b]", "node[1-2", "a,,b", "node[[1]]",
                                 "no de1", "node$(x)", "node[1-2].ib", "n[9-10]x", "node[1-99999999]"])
def test_expand_rejects(bad):
    with pytest.raises(HpcError) as err:
        expand(bad)
    assert "fix:" in str(err.value) and "\n" not in str(err.value)


prefixes = st.sampled_from(["node", "gpu-a", "n", "cn.", "r1-n"])
suffixes = st.sampled_from(["", "", ".ib"])
numbers = st.integers(min_value=0, max_value=3000)
widths = st.sampled_from([0, 3, 4])


@st.composite
def host_sets(draw):
    hosts = []
    for _ in range(draw(st.integers(1, 4))):
        prefix, width = draw(prefixes), draw(widths)
        nums = draw(st.lists(numbers, min_size=1, max_size=40))
        suffix = draw(suffixes)
        hosts += [f"{prefix}{str(n).zfill(width)}{suffix}" for n in nums]
    return hosts


@settings(max_examples=300, deadline=None)
@given(host_sets())
def test_compress_then_expand_keeps_the_set(hosts):
    text = compress(hosts)
    back = expand(text)
    assert sorted(back) == sorted(set(hosts))
    assert len(back) == len(set(back))


@settings(max_examples=200, deadline=None)
@given(host_sets())
def test_compress_is_stable(hosts):
    text = compress(hosts)
    assert compress(expand(text)) == text
