"""Stands in for the Hugging Face Hub in the runs of scripts/hf_examples.py (this machine cannot reach it)."""

import json
import os

if os.environ.get("HF_STAND_IN_DATASETS"):
    import datasets as _datasets

    _real_load = _datasets.load_dataset
    _folders = json.loads(os.environ["HF_STAND_IN_DATASETS"])

    def _stand_in(path=None, *args, **kwargs):
        if path in _folders:
            # The Hub's loader takes trust_remote_code; a local parquet folder's builder config refuses it.
            if not kwargs.get("trust_remote_code"):
                kwargs.pop("trust_remote_code", None)
            return _real_load(_folders[path], *args, **kwargs)
        return _real_load(path, *args, **kwargs)

    _datasets.load_dataset = _stand_in

if os.environ.get("HF_STAND_IN_REPOSITORY"):
    import huggingface_hub as _hub

    if not hasattr(_hub, "Repository"):
        # huggingface_hub 1.0 removed the git-based Repository; scripts only touch it with --push_to_hub, but
        # import it at the top, so without a placeholder they fail before training under any framework.
        class Repository:
            def __init__(self, *args, **kwargs):
                raise RuntimeError("huggingface_hub.Repository is gone (stand-in: no Hub here)")

        _hub.Repository = Repository
