"""The greedy text a model writes when every token is recomputed from the start of the text, in segments: the
expectation for sampling a model whose memory is written once per segment (`xl/generation.py`)."""
import torch


def greedy_by_recomputation(model, prompt: torch.Tensor, n_tokens: int, segment_len: int) -> torch.Tensor:
    """`n_tokens` greedy tokens after `prompt`, each from the text so far read afresh in segments of `segment_len`."""
    text = prompt
    with torch.no_grad():
        for _ in range(n_tokens):
            mems = None
            for start in range(0, text.shape[0], segment_len):
                log_probs, mems = model.log_probs(text[start:start + segment_len], mems)
            text = torch.cat([text, log_probs[-1].argmax(-1)[None]])
    return text[prompt.shape[0]:]
