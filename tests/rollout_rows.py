"""Random rows in the rollout layout for the learner tests (tests/test_megatron_packing.py,
tests/test_megatron_thd.py)."""
import torch


def rollout_rows(gen, lengths, vocab, *, left_pad: bool):
    """``[B, T]`` ids / attention / response masks: per row optional left padding, a prompt of 1-12
    tokens, then the response, then right padding (the rollout layout)."""
    B = len(lengths)
    pads = [int(torch.randint(0, 4, (), generator=gen)) if left_pad else 0 for _ in lengths]
    T = max(p + n for p, n in zip(pads, lengths))
    ids = torch.zeros(B, T, dtype=torch.long)
    am = torch.zeros(B, T, dtype=torch.long)
    rm = torch.zeros(B, T)
    for b, (p, n) in enumerate(zip(pads, lengths)):
        prompt = min(n, 1 + int(torch.randint(0, 12, (), generator=gen)))
        ids[b, p:p + n] = torch.randint(3, vocab, (n,), generator=gen)
        am[b, p:p + n] = 1
        rm[b, p + prompt:p + n] = 1
    return ids, am, rm
