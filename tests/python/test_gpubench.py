"""tests/gpu/gpubench.py against the library versions the GPU run has and
this machine does not (transformers 5): what can be checked without them.
The --cpu run of the whole script is test_gpu_script.py."""
import os
import sys

REPO = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
sys.path.insert(0, os.path.join(REPO, "tests", "gpu"))

import gpubench  # noqa: E402


def test_save_arguments_follow_the_signature():
    """transformers 4's save_pretrained has safe_serialization; 5's has not
    (it takes **kwargs and hands them on), so it is passed only to 4's."""
    def save_v4(save_directory, max_shard_size="5GB", safe_serialization=True, **kwargs):
        pass

    def save_v5(save_directory, max_shard_size="50GB", save_original_format=True, **kwargs):
        pass

    assert gpubench._save_arguments(save_v4, "64KB") == {"max_shard_size": "64KB",
                                                         "safe_serialization": True}
    assert gpubench._save_arguments(save_v5, "500MB") == {"max_shard_size": "500MB"}
    assert gpubench._save_arguments(print, "1GB") == {"max_shard_size": "1GB"}
