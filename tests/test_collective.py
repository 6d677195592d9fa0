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


def _worker(rank, world, init_file, cases, result_dir):
    """Every case in one process group (a spawn of 3 processes costs ~5 s of CPU, issue 41)."""
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=world)
    outcomes = []
    for errors in cases:
        try:
            collective_check(errors[rank])
            outcomes.append(None)
        except ValueError as e:
            outcomes.append(str(e))
        dist.barrier()  # every rank came back from the check: none is left waiting
    dist.destroy_process_group()
    with open(f"{result_dir}/rank{rank}.json", "w") as f:
        json.dump(outcomes, f)


CASES = [  # (what each rank reports, what each rank raises)
    ((None, None, None), (None, None, None)),
    ((None, "bad file", None), ("rank 1: bad file", "bad file", "rank 1: bad file")),
    # several failing ranks: every rank raises the lowest one's message (prefixed with its rank elsewhere)
    ((None, "first", "second"), ("rank 1: first", "first", "rank 1: first")),
    ((None, None, "last"), ("rank 2: last", "rank 2: last", "last")),
]


def test_every_rank_raises_when_one_reports(tmp_path):
    mp.spawn(_worker, args=(3, str(tmp_path / "init"), [errors for errors, _ in CASES], str(tmp_path)), nprocs=3,
             join=True)
    got = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(3)]
    for i, (errors, expected) in enumerate(CASES):
        assert tuple(outcomes[i] for outcomes in got) == expected, errors
