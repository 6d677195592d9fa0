"""pacs_fast/files.py: atomic writes, and the mode a written file gets."""
import os

import torch

from pacs_fast.files import write_atomic


def _mode(path) -> int:
    return os.stat(path).st_mode & 0o777


def test_a_file_written_atomically_gets_the_umask_s_mode(tmp_path):
    """safetensors' ``save_file`` creates its file 0600: a checkpoint's weights were readable by their owner
    alone (a real-shape sweep of 2026-11-30); every atomically written file now gets ``0o666 & ~umask``."""
    from safetensors.torch import save_file

    old = os.umask(0o022)
    try:
        write_atomic(tmp_path / "w.safetensors", lambda p: save_file({"a": torch.zeros(2)}, str(p)))
        assert _mode(tmp_path / "w.safetensors") == 0o644
        os.umask(0o077)  # a user who keeps files private keeps them so
        write_atomic(tmp_path / "private.txt", lambda p: p.write_text("x"))
        assert _mode(tmp_path / "private.txt") == 0o600
    finally:
        os.umask(old)


def test_a_checkpoint_s_weights_are_readable_as_its_other_files(tmp_path):
    import transformers

    from pacs_fast.config import AlgoConfig, LearnerConfig
    from pacs_fast.data.tiny import tiny_qwen2_config
    from pacs_fast.learner.torch_learner import TorchLearner

    model = transformers.Qwen2ForCausalLM(tiny_qwen2_config(64, hidden_size=32, num_layers=1, intermediate_size=64))
    learner = TorchLearner(model, algo=AlgoConfig(name="pacs"), learner=LearnerConfig(), temperature=1.0, horizon=4)
    old = os.umask(0o022)
    try:
        learner.save_hf(tmp_path / "ckpt")
    finally:
        os.umask(old)
    assert _mode(tmp_path / "ckpt" / "model.safetensors") == _mode(tmp_path / "ckpt" / "config.json") == 0o644


def test_the_mode_is_only_ever_widened_and_a_refused_chmod_is_no_error(tmp_path, monkeypatch):
    """A default ACL may give a file more than the umask does: nothing is taken away. A file system that
    refuses ``chmod`` (vfat, some FUSE mounts) must not fail the write (a checkpoint would stop the run)."""
    from pacs_fast.files import default_mode

    path = tmp_path / "wide.txt"
    path.write_text("x")
    os.chmod(path, 0o664)
    old = os.umask(0o022)
    try:
        default_mode(path)
        assert _mode(path) == 0o664

        def refuse(*args, **kwargs):
            raise PermissionError(1, "Operation not permitted")

        monkeypatch.setattr(os, "chmod", refuse)
        def write_private(p):  # as save_file does: a new file of mode 0600
            fd = os.open(p, os.O_CREAT | os.O_WRONLY, 0o600)
            os.write(fd, b"step_000002")
            os.close(fd)

        write_atomic(tmp_path / "latest", write_private)
        assert (tmp_path / "latest").read_text() == "step_000002" and _mode(tmp_path / "latest") == 0o600
    finally:
        os.umask(old)
