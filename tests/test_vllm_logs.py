"""What a vLLM engine's weight sync logs (a line per sync is a line per training step of a long run)."""


def test_a_sync_does_not_log_the_prefix_cache_reset():
    """vLLM's block pool logged "Successfully reset prefix cache" (INFO) at the reset that ends every weight sync: one
    line a training step (2,500 of a 2,646-line vLLM-CPU run log over 2,500 steps). The sync quiets that INFO line and
    keeps the pool's warnings (a reset that failed). No vLLM needed: a stand-in engine logs as the block pool does."""
    import logging

    from pacs_fast.rollout.vllm_engine import VLLMEngine

    pool = logging.getLogger("vllm.v1.core.block_pool")
    seen = []

    class Seen(logging.Handler):
        def emit(self, record):
            seen.append((record.levelno, record.getMessage()))

    class LLM:
        def reset_prefix_cache(self):
            pool.info("Successfully reset prefix cache")
            pool.warning("Failed to reset prefix cache")  # (the stand-in logs both: only the warning stays)
            return True

    engine = object.__new__(VLLMEngine)
    engine._asleep, engine._dead, engine.on_cpu, engine._llm = set(), None, False, LLM()
    engine._send_buckets = lambda buckets, stats: stats.update(buckets=1)
    handler, level = Seen(), pool.level
    pool.addHandler(handler)
    pool.setLevel(logging.INFO)
    try:
        engine._stream(iter([]))
        assert pool.level == logging.INFO  # (given back after the reset)
    finally:
        pool.removeHandler(handler)
        pool.setLevel(level)
    assert seen == [(logging.WARNING, "Failed to reset prefix cache")]
