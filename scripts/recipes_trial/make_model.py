"""A Qwen2.5-0.5B-width model (hidden 896, 14 / 2 heads, FFN 4864, 151,936 vocabulary rows, tied head; 2 layers)
with a byte-level BPE tokenizer (Qwen's kind) and a Qwen-style chat template, random weights; and a small
math dataset from the shipped gsm8k_train (pacs_fast/data/benchmarks/, as installed)."""
import gzip, json, sys
from pathlib import Path
import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import PreTrainedTokenizerFast, Qwen2ForCausalLM
from pacs_fast.data.datasets import shipped_path
from pacs_fast.data.tiny import tiny_qwen2_config

out = Path(sys.argv[1]); out.mkdir(parents=True, exist_ok=True)
# the copy shipped in the package (byte-identical to ../shared/data's): found where pacs_fast is installed, so this
# runs from any checkout or an installed package, not only from a checkout beside ../shared
rows = [json.loads(l) for l in gzip.open(shipped_path("gsm8k_train"), "rt")][:400]
corpus = [r.get("problem") or r.get("question") for r in rows] + [str(r.get("answer")) for r in rows]
tok = Tokenizer(models.BPE())
tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
tok.decoder = decoders.ByteLevel()
special = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
tok.train_from_iterator(corpus, trainers.BpeTrainer(vocab_size=2000, special_tokens=special,
                                                    initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
hf_tok = PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<|im_end|>", pad_token="<|endoftext|>")
hf_tok.chat_template = ("{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
                        "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")
hf_tok.save_pretrained(out / "qwen")
torch.manual_seed(0)
cfg = tiny_qwen2_config(151936, hidden_size=896, num_layers=2, num_heads=14, num_kv_heads=2, intermediate_size=4864,
                        max_positions=2048)
cfg.eos_token_id = hf_tok.convert_tokens_to_ids("<|im_end|>")
cfg.pad_token_id = hf_tok.convert_tokens_to_ids("<|endoftext|>")
cfg.bos_token_id = None
model = Qwen2ForCausalLM(cfg)
model.save_pretrained(out / "qwen")
with open(out / "data.jsonl", "w") as f:
    for i, r in enumerate(rows[:200]):
        f.write(json.dumps({"id": f"g{i}", "problem": r.get("problem") or r.get("question"), "answer": str(r["answer"])}) + "\n")
print("vocab", len(hf_tok), "params", sum(p.numel() for p in model.parameters()))
