"""What the local ranks' parent imports for them from the script's own imports (hpc.runtime.launch.local_ranks):
the names the script takes from a library it knows to be safe to import before forking, and nothing else."""

import textwrap

from hpc.runtime.launch.local_ranks import _named_from


def test_the_names_a_script_takes_from_transformers_are_found_in_every_spelling(tmp_path):
    script = tmp_path / "train.py"
    script.write_text(textwrap.dedent("""
        import os
        import transformers as tf
        from transformers import AutoTokenizer, LlamaConfig
        from datasets import load_dataset

        def main():
            from transformers.optimization import get_scheduler
            model = tf.LlamaForCausalLM(tf.LlamaConfig())
    """))
    found = _named_from(str(script), ("transformers",))
    assert found == {"transformers": {"AutoTokenizer", "LlamaConfig", "LlamaForCausalLM"}}


def test_a_script_without_them_or_that_does_not_parse_gets_nothing_warmed(tmp_path):
    plain, broken = tmp_path / "plain.py", tmp_path / "broken.py"
    plain.write_text("import torch\nfrom hpc import Accelerator\n")
    broken.write_text("def (:\n")
    assert _named_from(str(plain), ("transformers",)) == {}
    assert _named_from(str(broken), ("transformers",)) == {}
    assert _named_from(str(tmp_path / "missing.py"), ("transformers",)) == {}


def test_a_script_that_changes_its_environment_gets_nothing_warmed(tmp_path):
    """transformers reads its cache and offline settings as it is imported: after the script's own changes."""
    for change in ('os.environ["HF_HOME"] = "/data/hf"', 'os.environ.setdefault("HF_HUB_OFFLINE", "1")',
                   'environ.update(HF_HOME="/x")', 'os.putenv("HF_HOME", "/x")', 'del os.environ["HF_HOME"]'):
        script = tmp_path / "train.py"
        script.write_text(f"import os\nfrom os import environ\n{change}\nfrom transformers import AutoModel\n")
        assert _named_from(str(script), ("transformers",)) == {}, change
    script.write_text('import os\nrank = int(os.environ["RANK"])\nfrom transformers import AutoModel\n')
    assert _named_from(str(script), ("transformers",)) == {"transformers": {"AutoModel"}}  # reading is fine
