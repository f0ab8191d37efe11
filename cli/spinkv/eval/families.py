"""The suite's task families (the design study's list), each prompt built from corpus text.

Known-answer families (exact match): long_retrieval, source_conflict, current_turn.
Open-ended families (compared with fp16's reply): ordinary_chat, summarization, code,
repeated_topic, boundary (prompts whose length sits at page/window boundaries, in a session
whose context limit is a few tokens past the prompt, so the reply runs into it).
"""

from __future__ import annotations

import random
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from spinkv.errors import InvalidInputError
from spinkv.eval import sources

Messages = list[dict[str, str]]
PromptIds = Callable[[Messages], list[int]]

EXACT_FAMILIES = ("long_retrieval", "source_conflict", "current_turn")
OPEN_FAMILIES = ("ordinary_chat", "summarization", "code", "repeated_topic", "boundary")
FAMILIES = (
    "ordinary_chat",
    "long_retrieval",
    "source_conflict",
    "current_turn",
    "summarization",
    "code",
    "repeated_topic",
    "boundary",
)
RETRIEVAL_DEPTHS = (256, 512, 768, 1024)
"""Prompt lengths (tokens) the long-retrieval prompts cycle through, capped by the context."""
BOUNDARY_LENGTHS = (95, 96, 97, 127, 128, 129, 159, 160, 161, 255, 256, 257, 287, 288, 289)
BOUNDARY_LENGTHS += (383, 384, 385, 511, 512)
"""Prompt lengths at page (32) and window (128) boundaries, +-1."""
BOUNDARY_MARGINS = (0, 1, 2, 3, 5, 8)
"""Tokens between the end of a boundary prompt and the session's context limit."""


@dataclass
class TaskPrompt:
    family: str
    index: int
    source: str
    """The corpus texts the prompt is built from."""
    messages: Messages
    max_tokens: int
    token_ids: list[int]
    answer: str | None = None
    answer_kind: str = "open"  # "number", "text" or "open"
    distractor: str | None = None
    context_limit: int | None = None
    """The session's max_context (boundary family), else the model's."""
    meta: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return {
            "family": self.family,
            "index": self.index,
            "source": self.source,
            "prompt_tokens": len(self.token_ids),
            "last_user_message": self.messages[-1]["content"][-300:],
            "answer": self.answer,
            "answer_kind": self.answer_kind,
            "distractor": self.distractor,
            "context_limit": self.context_limit,
            **self.meta,
        }


# ---- answers -------------------------------------------------------------------------------


def _norm(text: str) -> str:
    return " ".join(text.lower().split())


def is_correct(prompt: TaskPrompt, reply: str) -> bool:
    """Exact match: the first number of the reply is the answer ("number"), or the reply
    names the answer before (or without) the distractor ("text")."""
    if prompt.answer is None:
        raise ValueError(f"{prompt.family} prompt {prompt.index} has no known answer")
    if prompt.answer_kind == "number":
        found = re.search(r"\d+", reply.replace(",", ""))
        return found is not None and found.group(0) == prompt.answer
    text, answer = _norm(reply), _norm(prompt.answer)
    at = text.find(answer)
    if at < 0:
        return False
    if prompt.distractor is None:
        return True
    other = text.find(_norm(prompt.distractor))
    return other < 0 or at <= other


def extracted_answer(prompt: TaskPrompt, reply: str) -> str:
    """What the reply answers, for agreement with fp16's answer: its first number, or its
    first line, normalised."""
    if prompt.answer_kind == "number":
        found = re.search(r"\d+", reply.replace(",", ""))
        return found.group(0) if found else ""
    lines = [line for line in reply.strip().splitlines() if line.strip()]
    return _norm(lines[0]).strip(" .!\"'") if lines else ""


# ---- building ------------------------------------------------------------------------------


@dataclass
class Builder:
    prompt_ids: PromptIds
    max_context: int
    count: int
    open_tokens: int
    answer_tokens: int
    seed: int

    def rng(self, family: str) -> random.Random:
        return random.Random(f"{family}:{self.seed}")

    def cap(self, target: int, reserve: int) -> int:
        return max(32, min(target, self.max_context - reserve - 1))


def _pick(items: Sequence[Any], count: int, rng: random.Random) -> list[Any]:
    """count items spread over the sequence (each once before any repeats), seeded."""
    if not items:
        raise InvalidInputError("the corpus gave no material for a task family")
    order = list(range(len(items)))
    rng.shuffle(order)
    return [items[order[i % len(order)]] for i in range(count)]


def _largest_fit(
    build: Callable[[int], Messages], prompt_ids: PromptIds, hi: int, target: int
) -> tuple[int, Messages, list[int]]:
    """The largest k in 1..hi whose messages fit in `target` tokens, with its messages/ids."""
    lo, best = 1, None
    while lo <= hi:
        mid = (lo + hi) // 2
        messages = build(mid)
        ids = prompt_ids(messages)
        if len(ids) <= target:
            best, lo = (mid, messages, ids), mid + 1
        else:
            hi = mid - 1
    if best is None:
        messages = build(1)
        return 1, messages, prompt_ids(messages)
    return best


def _fit_passage(
    b: Builder, passage: str, sep: str, make: Callable[[str], Messages]
) -> tuple[Messages, list[int]]:
    """make(passage), or make() of the passage's longest prefix (whole words or lines) that
    leaves room for the reply in the model's context."""
    room = b.max_context - b.open_tokens - 1
    messages = make(passage)
    ids = b.prompt_ids(messages)
    if len(ids) <= room:
        return messages, ids
    pieces = passage.split(sep)
    _, messages, ids = _largest_fit(
        lambda k: make(sep.join(pieces[:k])), b.prompt_ids, len(pieces), room
    )
    return messages, ids


def _user(content: str) -> Messages:
    return [{"role": "user", "content": content}]


CHAT_HISTORY_TURNS = 2
"""Earlier exchanges before an ordinary-chat question: a chat some turns in, so the cache
holds more than a short prompt (a 128-token fp16 window would otherwise hide everything)."""


def _explain(sentence: str) -> str:
    return f'Can you explain in simple words what this means? "{sentence}"'


def ordinary_chat(b: Builder) -> list[TaskPrompt]:
    """A chat some turns in: earlier exchanges ask to explain a sentence of a real text and
    get the paragraph it comes from as the reply; then the current question (explain a
    sentence, a network service, or something about a country)."""
    rng = b.rng("ordinary_chat")
    sentences = _pick(sources.sentences(), b.count, rng)
    services = _pick(sources.services(), b.count, rng)
    countries = _pick(sources.countries(), b.count, rng)
    history = _pick(sources.paragraphs(), CHAT_HISTORY_TURNS * b.count, rng)
    room = b.max_context - b.open_tokens - 1
    out = []
    for i in range(b.count):
        kind = i % 3
        if kind == 0:
            name, sentence = sentences[i]
            source, text = name, _explain(sentence)
        elif kind == 1:
            source, text = "services", f"What is the {services[i].name} network service used for?"
        else:
            source = "iso3166-tab"
            text = f"Tell me something interesting about {countries[i].name}."
        earlier = history[CHAT_HISTORY_TURNS * i : CHAT_HISTORY_TURNS * (i + 1)]
        for turns in range(len(earlier), -1, -1):  # fewer earlier turns on a short context
            messages: Messages = []
            for _, para in earlier[:turns]:
                messages.append({"role": "user", "content": _explain(_sentences(para)[0][:220])})
                messages.append({"role": "assistant", "content": para})
            messages += _user(text)
            ids = b.prompt_ids(messages)
            if len(ids) <= room:
                break
        sources_used = ",".join(dict.fromkeys([source, *(n for n, _ in earlier[:turns])]))
        meta = {"earlier_turns": turns}
        out.append(
            TaskPrompt("ordinary_chat", i, sources_used, messages, b.open_tokens, ids, meta=meta)
        )
    return out


def _services_question(lines: Sequence[str], at: int) -> sources.Service | None:
    """A service listed once in `lines`, at or after line `at` (wrapping)."""
    by_name = {s.name: s for s in sources.services()}
    chunk = "\n".join(lines)
    for step in range(len(lines)):
        fields = lines[(at + step) % len(lines)].split()
        svc = by_name.get(fields[0]) if fields else None
        if svc is None:
            continue
        mentions = len(re.findall(rf"(?<![\w-]){re.escape(svc.name)}(?![\w-])", chunk))
        starts = sum(1 for line in lines if line.split()[:1] == [svc.name])
        if mentions == starts:
            return svc
    return None


def long_retrieval(b: Builder) -> list[TaskPrompt]:
    rng = b.rng("long_retrieval")
    table = list(sources.service_lines())
    countries = list(sources.countries())
    out = []
    for i in range(b.count):
        depth = b.cap(RETRIEVAL_DEPTHS[i % len(RETRIEVAL_DEPTHS)], b.answer_tokens)
        position = rng.random()
        if i % 2 == 0:
            start = rng.randrange(len(table))
            rows = table[start:] + table[:start]

            def build(k: int, rows=rows, position=position) -> Messages:
                svc = _services_question(rows[:k], int(position * (k - 1)))
                name = svc.name if svc else rows[0].split()[0]
                body = "\n".join(rows[:k])
                return _user(
                    f"Here is part of the file /etc/services:\n\n{body}\n\nIn this list, which "
                    f'port number is given for the service "{name}"? Answer with the number only.'
                )

            k, messages, ids = _largest_fit(build, b.prompt_ids, len(rows), depth)
            question = _services_question(rows[:k], int(position * (k - 1)))
            if question is None:  # no unambiguous service in the chunk: the first line's
                first = rows[0].split()
                question = sources.Service(first[0], int(first[1].split("/")[0]), "", rows[0])
            answer, kind, source = str(question.port), "number", "services"
        else:
            start = rng.randrange(len(countries))
            crow = countries[start:] + countries[:start]

            def build_c(k: int, crow=crow, position=position) -> Messages:
                target = crow[int(position * (k - 1))]
                body = "\n".join(c.line for c in crow[:k])
                return _user(
                    f"Here is part of the ISO 3166 country code table:\n\n{body}\n\nIn this "
                    f"table, which country has the code {target.code}? Answer with the country "
                    "name only."
                )

            k, messages, ids = _largest_fit(build_c, b.prompt_ids, len(crow), depth)
            answer, kind, source = crow[int(position * (k - 1))].name, "text", "iso3166-tab"
        meta = {"depth_target": depth, "needle_position": round(position, 3)}
        out.append(
            TaskPrompt(
                "long_retrieval", i, source, messages, b.answer_tokens, ids, answer, kind, meta=meta
            )
        )
    return out


def source_conflict(b: Builder) -> list[TaskPrompt]:
    rng = b.rng("source_conflict")
    services = _pick(sources.services(), b.count, rng)
    others = _pick(sources.services(), b.count, rng)
    countries = _pick(sources.countries(), b.count, rng)
    wrong_countries = _pick(sources.countries(), b.count, rng)
    out = []
    for i in range(b.count):
        trust_first = i % 2 == 0
        if i % 4 < 2:
            svc, other = services[i], others[i]
            wrong = other.port if other.port != svc.port else svc.port + 1
            a = f'the system file /etc/services, which contains the line "{svc.line}"'
            c = f'a comment on a web forum saying "{svc.name} runs on port {wrong}"'
            first, second = (a, c) if trust_first else (c, a)
            rule = "Trust the system file over the forum comment."
            question = f"Which port does {svc.name} use? Answer with the number only."
            answer, distractor, kind, source = str(svc.port), str(wrong), "number", "services"
        else:
            ctry, wrong_c = countries[i], wrong_countries[i]
            if wrong_c.code == ctry.code:
                wrong_c = sources.countries()[(sources.countries().index(ctry) + 1) % 200]
            old = f'an atlas from 1990 that lists code {ctry.code} as "{wrong_c.name}"'
            new = f'the current ISO 3166 table, which has the line "{ctry.line}"'
            first, second = (new, old) if trust_first else (old, new)
            rule = "When sources disagree, the current table replaces the old atlas."
            question = f"Which country has the code {ctry.code}? Answer with the country name only."
            answer, distractor, kind, source = ctry.name, wrong_c.name, "text", "iso3166-tab"
        messages = _user(
            f"Two sources disagree.\nSource 1: {first}.\nSource 2: {second}.\n{rule} {question}"
        )
        out.append(
            TaskPrompt(
                "source_conflict", i, source, messages, b.answer_tokens, b.prompt_ids(messages),
                answer, kind, distractor, meta={"trusted_source": 1 if trust_first else 2},
            )
        )  # fmt: skip
    return out


def current_turn(b: Builder) -> list[TaskPrompt]:
    rng = b.rng("current_turn")
    table = list(sources.service_lines())
    words = _pick(sources.countries(), 2 * b.count, rng)
    out = []
    for i in range(b.count):
        if i % 2 == 0:
            w1, w2 = words[2 * i].name, words[2 * i + 1].name
            if w1 == w2:
                w2 = sources.countries()[0].name if w1 != sources.countries()[0].name else "Peru"
            messages: Messages = [
                {"role": "user", "content": f"Remember this code word: {w1}."},
                {"role": "assistant", "content": f"Got it. The code word is {w1}."},
                {
                    "role": "user",
                    "content": f"Change of plan: the code word is now {w2}. Forget the old one. "
                    "What is the code word? Answer with the word only.",
                },
            ]
            answer, distractor, kind, source = w2, w1, "text", "iso3166-tab"
        else:
            start = rng.randrange(len(table) - 8)
            rows = table[start : start + 8]
            while True:  # fewer lines until the prompt leaves room for the answer
                messages, s1, s2 = _switch_question(rows)
                fits = len(b.prompt_ids(messages)) <= b.max_context - b.answer_tokens - 1
                if fits or len(rows) <= 2:
                    break
                rows = rows[:-1]
            answer, distractor, kind, source = str(s2.port), str(s1.port), "number", "services"
        out.append(
            TaskPrompt(
                "current_turn", i, source, messages, b.answer_tokens, b.prompt_ids(messages),
                answer, kind, distractor,
            )
        )  # fmt: skip
    return out


def _switch_question(
    rows: list[str],
) -> tuple[Messages, sources.Service, sources.Service]:
    """Turn 1 asks for one service of the lines, turn 2 (the current one) for another."""
    s1 = _services_question(rows, 0)
    s2 = _services_question(rows, len(rows) - 2)
    if s1 is None or s2 is None or s1.port == s2.port:
        s1, s2 = sources.services()[10], sources.services()[20]
        rows = [s1.line, s2.line]
    body = "\n".join(rows)
    messages: Messages = [
        {"role": "user", "content": f"Here are lines of /etc/services:\n\n{body}\n\n"
         f"Which port is listed for {s1.name}?"},
        {"role": "assistant", "content": f"The port listed for {s1.name} is {s1.port}."},
        {"role": "user", "content": f"Thanks. Now, from the same lines: which port is "
         f"listed for {s2.name}? Answer with the number only."},
    ]  # fmt: skip
    return messages, s1, s2


def summarization(b: Builder) -> list[TaskPrompt]:
    paras = _pick(sources.paragraphs(), b.count, b.rng("summarization"))
    out = []
    for i, (name, para) in enumerate(paras):
        messages, ids = _fit_passage(
            b, para, " ", lambda t: _user(f"Summarise the following text in one sentence.\n\n{t}")
        )
        out.append(TaskPrompt("summarization", i, name, messages, b.open_tokens, ids))
    return out


CODE_ASKS = (
    "Explain briefly what this Python function does:",
    "Write a one-line docstring for this Python function:",
)


def code(b: Builder) -> list[TaskPrompt]:
    funcs = _pick(sources.python_functions(), b.count, b.rng("code"))
    out = []
    for i, (name, func, source) in enumerate(funcs):
        ask = CODE_ASKS[(i // len(sources.python_functions()) + i) % len(CODE_ASKS)]
        messages, ids = _fit_passage(
            b, source, "\n", lambda t, ask=ask: _user(f"{ask}\n\n```python\n{t}\n```")
        )
        out.append(
            TaskPrompt(
                "code", i, name, messages, b.open_tokens, ids,
                meta={"function": func},
            )
        )  # fmt: skip
    return out


def repeated_topic(b: Builder) -> list[TaskPrompt]:
    """Three user turns on one passage; the assistant's earlier turns quote the passage."""
    multi = [(name, para) for name, para in sources.paragraphs() if len(_sentences(para)) >= 2]
    picks = _pick(multi, b.count, b.rng("repeated_topic"))
    out = []
    for i, (name, para) in enumerate(picks):
        messages, ids = _fit_passage(b, para, " ", _repeated_topic_messages)
        out.append(TaskPrompt("repeated_topic", i, name, messages, b.open_tokens, ids))
    return out


def _sentences(text: str) -> list[str]:
    return re.split(r"(?<=[.!?])\s+", text)


def _repeated_topic_messages(text: str) -> Messages:
    parts = _sentences(text)
    second = parts[1] if len(parts) > 1 else parts[0]
    return [
        {"role": "user", "content": f"Please read this passage:\n\n{text}"},
        {"role": "assistant", "content": f'I have read it. It begins: "{parts[0]}"'},
        {"role": "user", "content": "What is the passage about?"},
        {"role": "assistant", "content": second},
        {"role": "user", "content": "Tell me again what the passage is about, in other words."},
    ]


BOUNDARY_TEXTS = ("bash-intro", "textwrap-py", "services", "apache-2.0", "bash-posix")
SOURCE_TEXTS = tuple(
    dict.fromkeys(
        ("services", "iso3166-tab", *sources.PROSE_TEXTS, *sources.CODE_TEXTS, *BOUNDARY_TEXTS)
    )
)
"""Every corpus text the prompts are built from."""


def boundary(
    b: Builder, tokenize: Callable[[str], list[int]], detokenize: Callable[[list[int]], str]
) -> list[TaskPrompt]:
    rng = b.rng("boundary")
    out = []
    for i in range(b.count):
        margin = BOUNDARY_MARGINS[i % len(BOUNDARY_MARGINS)]
        target = b.cap(BOUNDARY_LENGTHS[i % len(BOUNDARY_LENGTHS)], margin)
        name = BOUNDARY_TEXTS[i % len(BOUNDARY_TEXTS)]
        ids_text = tokenize(sources.text(name))
        start = rng.randrange(max(1, len(ids_text) - 1200))

        def build(k: int, start=start, ids_text=ids_text) -> Messages:
            excerpt = detokenize(ids_text[start : start + k])
            return _user(f"Continue this text:\n\n{excerpt}")

        _, messages, ids = _largest_fit(build, b.prompt_ids, min(1200, target), target)
        limit = min(len(ids) + margin, b.max_context)
        meta = {"length_target": target, "margin": limit - len(ids)}
        out.append(
            TaskPrompt(
                "boundary", i, name, messages, b.open_tokens, ids, context_limit=limit, meta=meta
            )
        )
    return out


def build_all(
    builder: Builder,
    tokenize: Callable[[str], list[int]],
    detokenize: Callable[[list[int]], str],
    families: Sequence[str] = FAMILIES,
) -> list[TaskPrompt]:
    """Every family's prompts, in FAMILIES order."""
    makers: dict[str, Callable[[Builder], list[TaskPrompt]]] = {
        "ordinary_chat": ordinary_chat,
        "long_retrieval": long_retrieval,
        "source_conflict": source_conflict,
        "current_turn": current_turn,
        "summarization": summarization,
        "code": code,
        "repeated_topic": repeated_topic,
        "boundary": lambda bb: boundary(bb, tokenize, detokenize),
    }
    out: list[TaskPrompt] = []
    for family in families:
        prompts = makers[family](builder)
        for p in prompts:
            if len(p.token_ids) <= (p.context_limit or builder.max_context):
                continue
            raise InvalidInputError(
                f"{family} prompt {p.index} is {len(p.token_ids)} tokens: no room to reply in "
                f"the context of {builder.max_context}"
            )
        out.extend(prompts)
    return out
