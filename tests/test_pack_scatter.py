"""pack() (learner.packing) fills its bins with one gather / scatter over the packed tokens, not a tensor copy per
row (on a GPU, a device-to-host copy and sync per row): the same layout as the per-row loop it replaced, exactly."""
import pytest
import torch

from pacs_fast.learner.packing import first_fit_decreasing, pack


def _pack_rows_loop(ids, att, capacity):
    """The per-row loop pack() ran before its one-scatter fill (the reference of the test below): the same bins,
    each row's tokens, positions and segment ids written row by row, empty slots numbered 0, 1, ..."""
    sizes = (att.sum(-1) - 1).clamp(min=1).tolist()
    bins = first_fit_decreasing(sizes, capacity)
    row, start = torch.empty(len(sizes), dtype=torch.long), torch.empty(len(sizes), dtype=torch.long)
    packed = torch.zeros(len(bins), capacity, dtype=ids.dtype)
    pos = torch.zeros(len(bins), capacity, dtype=torch.long)
    seg = torch.full((len(bins), capacity), -1, dtype=torch.long)
    for k, members in enumerate(bins):
        at = 0
        for i in sorted(members):
            n = sizes[i]
            row[i], start[i] = k, at
            packed[k, at:at + n], pos[k, at:at + n], seg[k, at:at + n] = ids[i, :n], torch.arange(n), i
            at += n
        pos[k, at:] = torch.arange(capacity - at)
    return packed, pos, seg, row, start


@pytest.mark.parametrize("implementation", ["sdpa", "eager", "flash_attention_2"])
def test_pack_fills_the_slots_the_per_row_loop_filled(seed, implementation):
    """pack() fills its bins with one scatter (no tensor op per row): token ids, positions, each row's bin and
    start, and the mask (from the segment ids) equal, exactly, the per-row loop's on uneven random rows (1 to 40
    tokens, a row of one token and one of none among them), in several bins or one (flash). A scatter with a
    wrong flat index (a row's start, another bin's stride, positions past a bin's fill) moves tokens or
    positions and fails the equality; integers, so no tolerance."""
    gen = torch.Generator().manual_seed(seed)
    for trial in range(5):
        b = int(torch.randint(2, 24, (), generator=gen))
        n = torch.randint(1, 41, (b,), generator=gen)
        n[0], n[-1] = 1, 0
        T = int(n.max())
        att = (torch.arange(T) < n[:, None]).long()
        ids = torch.randint(3, 1000, (b, T), generator=gen) * att
        p = pack(ids, att, implementation=implementation, dtype=torch.float32, window=7 if trial % 2 else None)
        sizes = (att.sum(-1) - 1).clamp(min=1)
        capacity = int(sizes.sum()) if implementation == "flash_attention_2" else int(sizes.max())
        packed, pos, seg, row, start = _pack_rows_loop(ids, att, capacity)
        assert torch.equal(p.input_ids, packed) and torch.equal(p.position_ids, pos)
        assert torch.equal(p.row, row) and torch.equal(p.start, start) and torch.equal(p.length, sizes)
        if implementation != "flash_attention_2":
            ok = (seg[:, :, None] == seg[:, None, :]) & torch.ones(capacity, capacity, dtype=torch.bool).tril()
            if trial % 2:
                ok &= (torch.arange(capacity)[:, None] - torch.arange(capacity)[None, :]) < 7
            ok = ok[:, None]
            want = ok if implementation == "sdpa" else \
                torch.zeros(ok.shape).masked_fill_(~ok, torch.finfo(torch.float32).min)
            assert torch.equal(p.attention_mask, want)
