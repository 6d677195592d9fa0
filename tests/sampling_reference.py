"""Reference sampling distributions for the engines' sampling tests (tests/test_hf_sampler.py,
tests/test_vllm_engine.py): softmax(logits / T) filtered by transformers' own warpers in vLLM's order, and
a chi-square statistic of sampled counts against a distribution."""
import math

import torch


def chi_square(counts: torch.Tensor, probs: torch.Tensor) -> tuple[float, int]:
    """Pearson statistic over bins with expected count >= 5 (the rest pooled into one bin)."""
    total = counts.sum()
    expected = probs * total
    big = expected >= 5
    obs = torch.cat([counts[big], counts[~big].sum()[None]])
    exp = torch.cat([expected[big], expected[~big].sum()[None]])
    keep = exp > 0
    stat = (((obs - exp) ** 2)[keep] / exp[keep]).sum().item()
    return stat, int(keep.sum()) - 1


def filtered_reference(logits: torch.Tensor, temperature: float, top_p: float, top_k: int, min_p: float):
    """softmax(logits / T) after transformers' own warpers, applied in vLLM's order (min-p, top-k, top-p)."""
    from transformers import MinPLogitsWarper, TopKLogitsWarper, TopPLogitsWarper

    scaled = (logits / temperature)[None].clone()
    for on, warper in ((min_p > 0, lambda: MinPLogitsWarper(min_p)), (top_k > 0, lambda: TopKLogitsWarper(top_k)),
                       (top_p < 1, lambda: TopPLogitsWarper(top_p))):
        if on:
            scaled = warper()(None, scaled)
    return torch.softmax(scaled[0], -1)


def six_sigma(df: int) -> float:
    """A chi-square bound with ``df`` degrees of freedom ~6 standard deviations up: a false alarm is
    practically impossible."""
    return df + 6 * math.sqrt(2 * df)
