"""Generate with transformers' `generate`, prove each completion with TOPLOC, ship it as JSON.

    python hf_generate.py [MODEL] [OUT]    # then, in another process: python verify.py [MODEL] [OUT]

A forward hook on the model's final norm keeps the last position's hidden state of each step
(the row the next token is sampled from); a logits processor draws that token with toploc's
seeded sampler (so a verifier can redraw it), forces it, and feeds the row to a ProofBuilder.
"""

import base64
import json
import sys

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer, GenerationConfig, LogitsProcessor

from toploc import ProofBuilder, sample_tokens

MODEL = sys.argv[1] if len(sys.argv) > 1 else "HuggingFaceTB/SmolLM2-135M-Instruct"
OUT = sys.argv[2] if len(sys.argv) > 2 else "rollouts.json"
SEED, TEMPERATURE, MAX_NEW_TOKENS = 2024, 1.0, 48
PROMPTS = ["What is 7 * 6?", "Name a prime number larger than 100."]


class ProvingSampler(LogitsProcessor):
    """Seeded draw of every token, plus one proof row per token, for a batch of sequences."""

    def __init__(self, batch: int, hidden_size: int, eos_token_id: int) -> None:
        self.builder = ProofBuilder(batch, hidden_size)  # 258-byte proof per 32 tokens
        self.tokens: list[list[int]] = [[] for _ in range(batch)]
        self.logprobs: list[list[float]] = [[] for _ in range(batch)]
        self.active = [True] * batch
        self.step = 0  # index of the token being drawn (the sampler's position)
        self.eos_token_id = eos_token_id
        self.last_rows: torch.Tensor | None = None  # set by the hook: final-norm output, last position

    def hook(self, module: torch.nn.Module, inputs: tuple, output: torch.Tensor) -> None:
        self.last_rows = output[:, -1, :]

    def __call__(self, input_ids: torch.LongTensor, scores: torch.FloatTensor) -> torch.FloatTensor:
        batch = scores.shape[0]
        drawn = sample_tokens(scores, SEED, torch.arange(batch), torch.full((batch,), self.step), TEMPERATURE)
        self.step += 1
        logprobs = torch.log_softmax(scores.float() / (TEMPERATURE or 1.0), -1).gather(-1, drawn[:, None])
        self.builder.add(self.last_rows, active_mask=self.active)  # the rows these tokens came from
        for i, token in enumerate(drawn.tolist()):
            if self.active[i]:
                self.tokens[i].append(token)
                self.logprobs[i].append(float(logprobs[i]))
                self.active[i] = token != self.eos_token_id
        forced = torch.full_like(scores, float("-inf"))
        return forced.scatter(-1, drawn[:, None], 0.0)  # greedy decoding then picks the draw


tokenizer = AutoTokenizer.from_pretrained(MODEL)
tokenizer.padding_side = "left"  # the last position of every row is then its last prompt token
model = AutoModelForCausalLM.from_pretrained(MODEL, dtype=torch.float32).eval()
batch = tokenizer(PROMPTS, return_tensors="pt", padding=True)
sampler = ProvingSampler(len(PROMPTS), model.config.hidden_size, tokenizer.eos_token_id)
hook = model.model.norm.register_forward_hook(sampler.hook)  # the final norm (Llama, Qwen, Mistral...)
config = GenerationConfig(  # nothing but our processor may touch the logits
    do_sample=False,
    max_new_tokens=MAX_NEW_TOKENS,
    eos_token_id=tokenizer.eos_token_id,
    pad_token_id=tokenizer.pad_token_id,
)
with torch.no_grad():
    model.generate(**batch, generation_config=config, logits_processor=[sampler])
hook.remove()

proofs = sampler.builder.finish()  # per sequence, its proofs concatenated
records = []
for i, prompt in enumerate(PROMPTS):
    records.append(
        {
            "prompt_ids": tokenizer(prompt)["input_ids"],
            "token_ids": sampler.tokens[i],
            "text": tokenizer.decode(sampler.tokens[i], skip_special_tokens=True),
            "logprobs": sampler.logprobs[i],
            "proofs": base64.b64encode(proofs[i]).decode(),
            "seed": SEED,
            "sequence_id": i,
            "temperature": TEMPERATURE,
        }
    )
with open(OUT, "w") as handle:
    json.dump(records, handle)
print(f"wrote {len(records)} completions ({[len(r['token_ids']) for r in records]} tokens) to {OUT}")
