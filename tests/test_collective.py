"""``collective_check``: every rank raises when any rank reports an error, so no rank is left
waiting in the next collective (two gloo processes), and a single process raises its own error."""
import json

import pytest
import torch.distributed as dist
import torch.multiprocessing as mp

from pacs_fast.collective import collective_check


def test_single_process_raises_its_own_error():
    collective_check(None)  # no error: returns
    with pytest.raises(ValueError, match="^shape mismatch$"):
        collective_check("shape mismatch")


def _worker(rank, world, init_file, errors, result_dir):
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=world)
    try:
        collective_check(errors[rank])
        outcome = None
    except ValueError as e:
        outcome = str(e)
    dist.barrier()  # every rank came back from the check: none is left waiting
    dist.destroy_process_group()
    with open(f"{result_dir}/rank{rank}.json", "w") as f:
        json.dump(outcome, f)


@pytest.mark.parametrize("errors, expected", [
    ((None, None, None), (None, None, None)),
    ((None, "bad file", None), ("rank 1: bad file", "bad file", "rank 1: bad file")),
    # several failing ranks: every rank raises the lowest one's message (prefixed with its rank elsewhere)
    ((None, "first", "second"), ("rank 1: first", "first", "rank 1: first")),
])
def test_every_rank_raises_when_one_reports(tmp_path, errors, expected):
    mp.spawn(_worker, args=(3, str(tmp_path / "init"), errors, str(tmp_path)), nprocs=3, join=True)
    got = tuple(json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(3))
    assert got == expected
