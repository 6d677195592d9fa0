"""build_batch / response_values: the right-padded prompt + response layout, against a per-row loop."""
import random

import pytest
import torch

from pacs_fast.trainer.batch import build_batch, outcome_token_rewards, response_values


def random_rollouts(rng, P, G, empty=True):
    prompts = [[rng.randrange(3, 90) for _ in range(rng.randint(1, 7))] for _ in range(P)]
    responses = [[[rng.randrange(3, 90) for _ in range(rng.randint(0 if empty else 1, 12))] for _ in range(G)]
                 for _ in range(P)]
    values = [[[rng.random() + 0.1 for _ in r] for r in g] for g in responses]
    return prompts, responses, values


def test_layout_matches_a_row_loop(seed):
    rng = random.Random(seed)
    for _ in range(10):
        P, G = rng.randint(1, 6), rng.randint(1, 5)
        prompts, responses, values = random_rollouts(rng, P, G)
        rewards = [rng.random() for _ in range(P * G)]
        b = build_batch(prompts, responses, rewards, pad_id=0)
        v = response_values(prompts, values, b.input_ids.shape)
        T = max(len(p) + len(r) for p, g in zip(prompts, responses) for r in g)
        assert b.input_ids.shape == (P * G, T) and b.group_size == G
        assert b.attention_mask.dtype == torch.long and b.response_mask.dtype == torch.float32
        row = 0
        for p, g, vg in zip(prompts, responses, values):
            for r, vals in zip(g, vg):
                n = len(p) + len(r)
                assert b.input_ids[row, :n].tolist() == p + r and bool((b.input_ids[row, n:] == 0).all())
                assert b.attention_mask[row].tolist() == [1] * n + [0] * (T - n)
                assert b.response_mask[row].tolist() == [0.0] * len(p) + [1.0] * len(r) + [0.0] * (T - n)
                assert v[row, len(p):n].tolist() == torch.tensor(vals, dtype=torch.float32).tolist()
                assert int(v[row].count_nonzero()) == len(r)
                row += 1
        assert torch.equal(b.rewards, torch.tensor(rewards, dtype=torch.float32))
        last = outcome_token_rewards(b)
        assert torch.allclose(last.sum(-1), b.rewards * (b.response_mask.sum(-1) > 0))


def test_bad_inputs_name_the_problem(seed):
    rng = random.Random(seed)
    prompts, responses, values = random_rollouts(rng, 3, 2, empty=False)
    with pytest.raises(ValueError, match="rewards has"):
        build_batch(prompts, responses, [0.0], pad_id=0)
    with pytest.raises(ValueError, match="same number"):
        build_batch(prompts, [responses[0], responses[1][:1], responses[2]], [0.0] * 5, pad_id=0)
    b = build_batch(prompts, responses, [0.0] * 6, pad_id=0)
    with pytest.raises(ValueError, match="cover 4 rows"):
        response_values(prompts[:2], values[:2], b.input_ids.shape)
    long = [[v + [0.5] * 20 for v in g] for g in values]
    with pytest.raises(ValueError, match="past the batch width"):
        response_values(prompts, long, b.input_ids.shape)
