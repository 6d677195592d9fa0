"""Prompts in the paper's format.

PACS (``src/preprocess_dataset.py``) sends one user message, ``f"{problem} {INSTRUCTION}"``,
through the model's chat template, which adds its own default system message where it has one (Qwen2's
``"You are a helpful assistant."``; Qwen2.5's ``"You are Qwen, created by Alibaba Cloud. You are a helpful
assistant."``). Here the system message is explicit, ``"You are a helpful assistant."`` (DESIGN.md), so the
prompt is well-defined for every template; an empty ``system`` leaves it to the template's default.

A tokenizer without a chat template (the tiny character tokenizer of the tests, base models) gets
the plain format::

    {system}\\n\\nUser: {problem} {instruction}\\nAssistant:

(the ``{system}\\n\\n`` part is left out when ``system`` is ``None`` or empty, and the instruction
when ``instruction`` is ``None`` or empty). A chat template that refuses a system message (Gemma's), or drops
it without a word (Phi-3's first one renders only the user and assistant turns), gets one user message,
``{system}\\n\\n{problem} {instruction}``.

``prompt_template`` (``data.prompt_template``, eval's ``--prompt-template``: pacs_fast/config/prompt_template_checks.py)
picks the format: ``"chat"`` (the default) as above, ``"plain"`` the plain format even where the tokenizer has a chat
template (a base model trained R1-Zero style), or a text of the user's own holding ``{problem}`` (and ``{instruction}``
/ ``{system}`` where it wants them): :func:`fill_template`, encoded as the plain format is.
"""
from __future__ import annotations

import re
from typing import Iterable

from pacs_fast.config.prompt_template_checks import CHAT, PLAIN, is_custom, names

SYSTEM_PROMPT = "You are a helpful assistant."
INSTRUCTION = "Please reason step by step, and put your final answer within \\boxed{}."
PLAIN_USER_PREFIX = "User: "
PLAIN_ASSISTANT_PREFIX = "Assistant:"
ENCODE_CHUNK = 1024  # prompts tokenised per call by encode_prompts


# an answer-format request in the problem text itself: an empty \boxed{} ("output the final answer within \boxed{}",
# DeepScaleR's and verl's MATH preprocessing), a quoted "####" (verl's GSM8K: 'after "####"') or DAPO-Math-17k's
# "Answer: $Answer"
FORMAT_REQUEST = re.compile(r"\\boxed\s*\{\s*\}|[\"'\u201c\u2018]####[\"'\u201d\u2019]|Answer:\s*\$Answer\b")


def asks_for_a_format(problem: str, instruction: str | None) -> bool:
    """Whether ``instruction`` would be appended (:func:`user_text`) to a problem that already asks for an answer
    format of its own (:data:`FORMAT_REQUEST`): two instructions in one prompt, which may not agree."""
    return bool(instruction) and user_text(problem, instruction) != problem and bool(FORMAT_REQUEST.search(problem))


def prompt_parts(system_prompt: str = "pacs", instruction: str = "pacs",
                 prompt_template: str = CHAT) -> tuple[str | None, str | None]:
    """``(system, instruction)`` for :func:`build_prompt` from the settings ``data.system_prompt`` /
    ``data.instruction`` (eval: ``--system-prompt`` / ``--instruction``): ``"pacs"`` is the paper's text,
    ``""`` none, anything else the text itself. Under a ``prompt_template`` of the user's own, a part it does not
    name (``{system}`` / ``{instruction}``) is None: no prompt carries it."""
    def pick(value: str, paper: str, part: str) -> str | None:
        if not names(prompt_template, part):
            return None
        return paper if value == "pacs" else (value or None)

    return pick(system_prompt, SYSTEM_PROMPT, "system"), pick(instruction, INSTRUCTION, "instruction")


def fill_template(template: str, problem: str, *, system: str | None = None, instruction: str | None = None) -> str:
    """A prompt template of the user's own (``data.prompt_template``) with ``{problem}`` replaced by ``problem`` as
    given, ``{system}`` / ``{instruction}`` by those texts (empty where None). Only these literal placeholders are
    replaced, in the template's own text alone (not in the problem, nor in the texts put in): every other brace, as
    ``\\boxed{}``'s, stays as written (``str.format`` would have read it as a field)."""
    if not isinstance(problem, str):
        raise ValueError(f"problem must be a string, got {type(problem).__name__}")
    texts = {"system": system or "", "instruction": instruction or ""}

    def fill(part: str) -> str:
        return re.sub(r"\{(system|instruction)\}", lambda m: texts[m.group(1)], part)

    head, tail = template.split("{problem}", 1)
    return fill(head) + problem + fill(tail)


def _starts_with_bos(tokenizer, prompt_template: str) -> bool:
    """Whether a template of the user's own begins with the tokenizer's BOS text (``<|begin_of_text|>...``): its
    prompts are then encoded without the tokenizer's own BOS, which would be a second one."""
    bos = getattr(tokenizer, "bos_token", None)
    return is_custom(prompt_template) and isinstance(bos, str) and bool(bos) and prompt_template.startswith(bos)


def template_format_request(tokenizer, system: str | None, instruction: str | None,
                            template_kwargs: dict | None = None, prompt_template: str = CHAT) -> str | None:
    """The request for an answer format (:data:`FORMAT_REQUEST`) in the chat template's own default system message,
    when the prompts leave it to the template (``system`` None or empty) and ``instruction`` appends one to each
    problem as well: two instructions in one prompt (Qwen2.5-Math's template writes "Please reason step by step,
    and put your final answer within \\boxed{}." as its system message, the paper's instruction word for word).
    That sentence, or None (always with a ``prompt_template`` other than ``chat``: no chat template is used)."""
    if system or not instruction or prompt_template != CHAT or not has_chat_template(tokenizer):
        return None
    try:
        alone = build_prompt(tokenizer, "\u2063", system=None, instruction=None, template_kwargs=template_kwargs)
    except Exception:  # (a template that cannot render this is reported where the prompts are built)
        return None
    head = alone.split("\u2063", 1)[0]  # what the template writes before the user's text
    found = FORMAT_REQUEST.search(head)
    if not found:
        return None
    start = max(head.rfind("\n", 0, found.start()), head.rfind(">", 0, found.start())) + 1
    end = found.end() + (head[found.end():found.end() + 1] == ".")
    return head[start:end].strip()


def user_text(problem: str, instruction: str | None = INSTRUCTION) -> str:
    """The user message: the problem, a space, the instruction (as PACS builds it). A problem that already
    ends with the instruction (a dataset prepared in this format) is left as it is, not given it twice."""
    if not isinstance(problem, str):
        raise ValueError(f"problem must be a string, got {type(problem).__name__}")
    if not instruction or problem.rstrip().endswith(instruction):
        return problem
    return f"{problem} {instruction}"


def build_messages(problem: str, *, system: str | None = SYSTEM_PROMPT,
                   instruction: str | None = INSTRUCTION) -> list[dict[str, str]]:
    """Chat messages ``[{"role": "system", ...}, {"role": "user", ...}]`` for one problem."""
    messages = [{"role": "system", "content": system}] if system else []
    messages.append({"role": "user", "content": user_text(problem, instruction)})
    return messages


def _render(tokenizer, messages: list[dict[str, str]], template_kwargs: dict | None = None) -> str:
    return tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True,
                                         **(template_kwargs or {}))


def template_kwargs_effect(tokenizer, template_kwargs: dict | None, prompt_template: str = CHAT,
                           template_key: str = "data.prompt_template") -> str | None:
    """A line when ``template_kwargs`` cannot change the prompts: ``prompt_template`` (the setting ``template_key``)
    is not the chat template, the tokenizer has no chat template (the plain format), or its template renders a prompt
    the same with and without them (it reads none of those names)."""
    if not template_kwargs:
        return None
    if prompt_template != CHAT:
        what = "the plain format" if prompt_template == PLAIN else "a text of its own"
        return f"{template_key} is {what}, not the chat template: they change nothing"
    if not has_chat_template(tokenizer):
        return "the tokenizer has no chat template (the plain prompt format): they change nothing"
    try:  # built as the prompts are: a template without a system role (Gemma's) raised here, and said nothing
        same = build_prompt(tokenizer, "1+1?", use_chat_template=True) == \
            build_prompt(tokenizer, "1+1?", use_chat_template=True, template_kwargs=template_kwargs)
    except Exception:  # (a template that cannot render this is reported where the prompts are built)
        return None
    return (f"the chat template renders the same prompt with and without them (it reads none of "
            f"{', '.join(sorted(template_kwargs))})") if same else None


def takes_system_message(tokenizer) -> bool:
    """Whether the tokenizer's chat template renders a system message (Gemma's raise "System role not
    supported", Phi-3's first one leaves it out; :func:`build_prompt` then puts the system text first in the user
    message)."""
    try:
        return _holds(_render(tokenizer, build_messages("1+1?")), SYSTEM_PROMPT)
    except Exception:
        pass
    try:  # a template that renders nothing (a syntax error) is not one without a system role: its error says why
        _render(tokenizer, build_messages("1+1?", system=None))
    except Exception:
        return True
    return False


def system_in_user_turn(tokenizer, system: str | None, prompt_template: str = CHAT) -> bool:
    """Whether :func:`build_prompt` puts a ``system`` text first in the user message: it is given, the prompts are
    the chat template's (``prompt_template`` chat) and that template takes no system message."""
    return bool(system) and prompt_template == CHAT and has_chat_template(tokenizer) and \
        not takes_system_message(tokenizer)


def _holds(text: str, system: str) -> bool:
    """Whether a rendered prompt holds the system text (a template may trim it, as Llama 3's do)."""
    return system.strip() in text


def has_chat_template(tokenizer) -> bool:
    return bool(getattr(tokenizer, "chat_template", None))


def build_prompt(tokenizer, problem: str, *, system: str | None = SYSTEM_PROMPT,
                 instruction: str | None = INSTRUCTION, use_chat_template: bool | None = None,
                 template_kwargs: dict | None = None, prompt_template: str = CHAT) -> str:
    """The prompt text for one problem, ending where the model's answer starts.

    ``use_chat_template``: ``None`` uses the tokenizer's chat template when it has one, else the
    plain format (module docstring); ``True`` requires a template; ``False`` forces the plain format.
    ``template_kwargs``: the chat template's variables (``{"enable_thinking": False}`` for Qwen3's).
    ``prompt_template``: ``"chat"`` (the default) as ``use_chat_template`` says; ``"plain"`` the plain format, a text
    of the user's own :func:`fill_template` (either way ``use_chat_template`` is not read).
    """
    if is_custom(prompt_template):
        return fill_template(prompt_template, problem, system=system, instruction=instruction)
    if prompt_template == PLAIN:
        use_chat_template = False
    if use_chat_template is None:
        use_chat_template = has_chat_template(tokenizer)
    if use_chat_template:
        if not has_chat_template(tokenizer):
            raise ValueError("use_chat_template=True but the tokenizer has no chat template")
        try:
            text = _render(tokenizer, build_messages(problem, system=system, instruction=instruction),
                           template_kwargs)
        except Exception as e:  # jinja2's TemplateError: Gemma's templates raise "System role not supported"
            if not system:
                raise ValueError(f"{_template_source(tokenizer)} cannot render the prompt ({type(e).__name__}: {e})") \
                    from None
            first = f"{type(e).__name__}: {e}"
        else:
            # (SmolLM3's template removes /no_think and /think from the system text it renders)
            if not system or _holds(text, system) or takes_system_message(tokenizer):
                return text
            # Phi-3's first template renders only user and assistant turns: the system text was dropped silently
            first = "it leaves the system message out"
        # a template without a system role: the system message goes first in the user's (as Gemma's own does)
        try:
            return _render(tokenizer, [{"role": "user", "content": f"{system}\n\n{user_text(problem, instruction)}"}],
                           template_kwargs)
        except Exception as e:
            raise ValueError(f"{_template_source(tokenizer)} cannot render the prompt ({first}; without a system "
                             f"message: {type(e).__name__}: {e})") from None
    head = f"{system}\n\n" if system else ""
    return f"{head}{PLAIN_USER_PREFIX}{user_text(problem, instruction)}\n{PLAIN_ASSISTANT_PREFIX}"


def _template_source(tokenizer) -> str:
    """Where the tokenizer's chat template comes from, for an error line: ``the chat template of <folder>
    (chat_template.jinja)`` or ``(tokenizer_config.json's chat_template)``; the tokenizer's, when not loaded from
    a folder. (A broken template had been "the tokenizer's chat template", naming no folder or file.)"""
    from pathlib import Path

    name = str(getattr(tokenizer, "name_or_path", "") or "")
    folder = Path(name)
    if not name or not folder.is_dir():
        return "the tokenizer's chat template"
    if (folder / "chat_template.jinja").is_file():
        return f"the chat template of {folder} (chat_template.jinja)"
    return f"the chat template of {folder} (tokenizer_config.json's chat_template)"


def encode_prompts(tokenizer, problems: Iterable[str], *, system: str | None = SYSTEM_PROMPT,
                   instruction: str | None = INSTRUCTION, use_chat_template: bool | None = None,
                   template_kwargs: dict | None = None, prompt_template: str = CHAT) -> list[list[int]]:
    """Token ids of :func:`build_prompt` for each problem (what a rollout engine takes).

    Chat-template text already holds any BOS the template wants, so it is encoded without extra
    special tokens; the plain format gets the tokenizer's usual special tokens before the text (a BOS), none
    after it (a tokenizer that appends EOS, ``add_eos_token=True``, ended every prompt with an end of sequence).
    A ``prompt_template`` of the user's own is encoded as the plain format (``"plain"`` is it), but one that begins
    with the BOS text gets no second BOS.
    """
    if prompt_template != CHAT:
        use_chat_template = False
    if use_chat_template is None:
        use_chat_template = has_chat_template(tokenizer)
    # the plain text ends with "Assistant:": an EOS id after it is the tokenizer's own
    eos = None if use_chat_template else getattr(tokenizer, "eos_token_id", None)
    specials = not use_chat_template and not _starts_with_bos(tokenizer, prompt_template)
    out: list[list[int]] = []
    problems = list(problems)
    # a chunk at a time: one call over a 100k-row dataset held every text, its ids and its attention mask at
    # once (+2 GB of Python objects for 14M tokens, most of which the allocator kept)
    for start in range(0, len(problems), ENCODE_CHUNK):
        texts = [build_prompt(tokenizer, p, system=system, instruction=instruction, use_chat_template=use_chat_template,
                              template_kwargs=template_kwargs, prompt_template=prompt_template)
                 for p in problems[start:start + ENCODE_CHUNK]]
        enc = tokenizer(texts, add_special_tokens=specials, return_attention_mask=False)
        out += [list(ids[:-1]) if eos is not None and len(ids) > 1 and ids[-1] == eos else list(ids)
                for ids in enc["input_ids"]]
    return out


def _special_tokens(tokenizer) -> dict[int, str]:
    """id -> text of the tokenizer's special tokens: the named ones and every added token marked special
    (``<|im_start|>`` / ``<|im_end|>`` are added tokens, not always among ``all_special_tokens``)."""
    out = dict(zip(tokenizer.all_special_ids, tokenizer.all_special_tokens))
    for i, token in getattr(tokenizer, "added_tokens_decoder", {}).items():
        if getattr(token, "special", False):
            out[int(i)] = str(token)
    return out


def _own_turn_end(special: dict[int, str], markers: list[str], stop_ids: list[int], length_key: str,
                  prompt_template: str) -> list[str]:
    """A line where a prompt template of the user's own ends the user's turn with a special token (the first one
    after ``{problem}``) that is not a stop token: the model ends its own turn with it and runs on past it (a base
    Qwen2.5, EOS ``<|endoftext|>``, under a text in Qwen's ``<|im_start|>`` format)."""
    if not is_custom(prompt_template):
        return []
    tail = prompt_template.split("{problem}", 1)[1]
    found = sorted((tail.find(m), m) for m in markers if m in tail)
    ids = {text: i for i, text in special.items()}
    if not found or ids[found[0][1]] in stop_ids:
        return []
    name, key = found[0][1], "--prompt-template" if length_key.startswith("--") else "data.prompt_template"
    return [f"{key} ends the user's turn with {name!r} (id {ids[name]}), which is not a stop token "
            f"(EOS of the tokenizer and generation_config.json: {stop_ids}): responses run past the end of their "
            f"turn until {length_key}; add it to generation_config.json's eos_token_id"]


def prompt_warnings(tokenizer, problems: list[str], stop_ids: list[int], *, held_out: list[str] = (),
                    length_key: str = "rollout.max_new_tokens", prompt_template: str = CHAT) -> list[str]:
    """Lines about prompts the chat template will not build as meant: problems (and ``held_out`` ones, in a line
    of their own) that already hold the template's special tokens (wrapped in it a second time), a template that
    adds no assistant header (``add_generation_prompt`` changes nothing: the prompt ends after the user's turn),
    and an end-of-turn token that is not among ``stop_ids`` (the generation's stop tokens: responses run on past
    their turn, e.g. a base Qwen2.5 model, whose EOS is ``<|endoftext|>``, under its ``<|im_end|>`` template;
    ``length_key`` names the setting they run to: eval's ``--max-tokens``). None where the prompts are not the chat
    template's (``prompt_template`` plain or a text of the user's own): problems holding the tokenizer's special tokens
    (encoded as those tokens, not as their text), and a text of the user's own whose first special token after
    ``{problem}`` (the end of the user's turn: ``<|im_end|>`` in Qwen's format) is not among ``stop_ids``."""
    special = _special_tokens(tokenizer)
    # (the UNK's text is a problem's usual word, except where it is also the BOS / EOS / pad: OLMo 2's <|endoftext|>)
    named = {tokenizer.bos_token, tokenizer.eos_token, tokenizer.pad_token}
    markers = [t for t in special.values() if len(t) > 2 and (t != tokenizer.unk_token or t in named)]
    chat = prompt_template == CHAT and has_chat_template(tokenizer)
    lines = []
    for what, texts in (("problems", problems), ("held-out problems", held_out)):
        held = [p for p in texts if any(m in p for m in markers)]
        if held:
            mark = next(m for m in markers if m in held[0])
            lines.append(f"{len(held)} of {len(texts)} {what} already hold the " + (
                f"chat template's special tokens (e.g. {mark!r}): each is wrapped in the template again" if chat else
                f"tokenizer's special tokens (e.g. {mark!r}): each is encoded as those tokens, not as its text")
                + "; give the problems as plain text")
    if not chat:
        return lines + _own_turn_end(special, markers, stop_ids, length_key, prompt_template)
    messages = [{"role": "user", "content": "Q"}]
    try:
        with_header = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
        without = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=False)
        turn = tokenizer.apply_chat_template(messages + [{"role": "assistant", "content": "A\u2063"}],
                                             tokenize=False)
    except Exception:  # (a template that cannot render this is reported where the prompts are built)
        return lines
    # Mistral's and Llama 2's templates ignore add_generation_prompt: their user turn ends with the assistant's cue
    # ("[/INST]"), where an assistant turn of the template begins its text. Only a prompt that stops short of it warns.
    before = turn.split("A\u2063", 1)[0] if "A\u2063" in turn else None
    if with_header == without and (before is None or before.rstrip() != without.rstrip()):
        lines.append("the chat template adds nothing for add_generation_prompt: each prompt ends after the "
                     "user's turn, with no assistant header for the model to answer after")
    after = turn.split("A\u2063", 1)[1] if "A\u2063" in turn else ""
    ids = tokenizer(after, add_special_tokens=False)["input_ids"] if after.strip() else []
    if ids and ids[0] in special and ids[0] not in stop_ids:
        name = special[ids[0]]
        lines.append(f"the chat template ends an assistant turn with {name!r} (id {ids[0]}), which is not a stop token "
                     f"(EOS of the tokenizer and generation_config.json: {stop_ids}): responses run past the end "
                     f"of their turn until {length_key}; add it to generation_config.json's eos_token_id")
    return lines
