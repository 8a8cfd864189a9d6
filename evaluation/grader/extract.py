"""Answer extraction from a model completion.

Order of preference (the harness convention of the reference, eval.md section 1.5):

1. Minerva's "final answer is $...$. I hope it is correct." sentence;
2. the content of the last ``\\boxed{...}`` or ``\\fbox{...}`` (braces matched, so nested
   groups such as ``\\boxed{\\frac{1}{2}}`` come out whole; ``\\boxed 5`` is accepted too);
3. the content of the last ``<answer>...</answer>`` tag (R1-style prompts);
4. the text after the last "the answer is" / "final answer is" / "answer:";
5. the number after the last ``####`` (GSM8K style);
6. the last number in the text.

A final box that is opened but never closed (a completion cut off inside its answer) yields
None rather than half an answer or an unrelated earlier number.
"""

from __future__ import annotations

import re

_BOX_RE = re.compile(r"\\(?:boxed|fbox)(?![a-zA-Z])")
_MINERVA_RE = re.compile(r"final answer is\s*\$(.+?)\$\s*\.?\s*I hope", re.IGNORECASE | re.DOTALL)
# the closing tag may be missing when it was the stop string (trimmed by the server)
_ANSWER_TAG_RE = re.compile(r"<answer>(.*?)(?:</answer>|$)", re.DOTALL)
_ANSWER_IS_RE = re.compile(r"(?:the|final)\s+answer\s+is\b|\banswer\s*:", re.IGNORECASE)
_HASH_RE = re.compile(r"####\s*\$?\s*(-?[\d,]*\.?\d+)")
_NUMBER_RE = re.compile(r"-?\d[\d,]*(?:\.\d+)?|-?\.\d+")


def match_brace(text: str, open_index: int) -> int | None:
    """Index of the ``}`` closing the ``{`` at ``open_index``, or None when unbalanced.

    Escaped braces (``\\{``, ``\\}``) count as braces too, as in LaTeX source they always come in
    pairs inside an answer (sets).
    """
    depth = 0
    for i in range(open_index, len(text)):
        ch = text[i]
        if ch == "{":
            depth += 1
        elif ch == "}":
            depth -= 1
            if depth == 0:
                return i
    return None


def _box_content(text: str, box: re.Match) -> str | None:
    """What the box command ``box`` holds: ``{...}`` (braces matched) or ``\\boxed 5``'s token;
    None when the braces never close or nothing follows."""
    i = box.end()
    while i < len(text) and text[i] == " ":
        i += 1
    if i < len(text) and text[i] == "{":
        end = match_brace(text, i)
        return None if end is None else text[i + 1:end]
    token = re.match(r"[^\s$]+", text[i:]) if i > box.end() else None  # up to '$' or a space
    return token.group(0) if token else None


def boxed_contents(text: str) -> list[str]:
    """Contents of every complete ``\\boxed``/``\\fbox`` in ``text``, in order of appearance."""
    contents = (_box_content(text, m) for m in _BOX_RE.finditer(text))
    return [c for c in contents if c is not None]


def last_boxed(text: str) -> str | None:
    """Content of the last complete box, or None."""
    boxes = boxed_contents(text)
    return boxes[-1] if boxes else None


def final_boxed(text: str | None) -> str | None:
    """Content of the text's final box command (stripped), or None when there is none or that
    one is incomplete: a response truncated inside its answer must not be graded on an earlier
    box (slime's ``last_boxed_only_string`` does the same). The ``math`` reward's extraction."""
    matches = list(_BOX_RE.finditer(text or ""))
    if not matches:
        return None
    content = _box_content(text, matches[-1])
    return None if content is None else content.strip()


def _clean_tail(fragment: str) -> str:
    """The answer part of the text after "the answer is": up to the end of the line/sentence."""
    fragment = fragment.strip().lstrip(":").strip()
    fragment = fragment.split("\n", 1)[0]
    # end of sentence: a period followed by whitespace (decimals like 3.5 have no space)
    fragment = re.split(r"\.\s", fragment, maxsplit=1)[0]
    fragment = fragment.strip().rstrip(".").strip()
    math = re.match(r"\$((?:\\\$|[^$])*)\$", fragment)  # $...$ whose inside may hold \$
    if math:
        fragment = math.group(1)
    return fragment.strip().strip("$").strip()


def _last_box_is_open(text: str) -> bool:
    matches = list(_BOX_RE.finditer(text))
    if not matches:
        return False
    i = matches[-1].end()
    while i < len(text) and text[i] == " ":
        i += 1
    return i < len(text) and text[i] == "{" and match_brace(text, i) is None


def last_number(text: str) -> str | None:
    """The last number in ``text`` with thousands commas removed, or None."""
    numbers = _NUMBER_RE.findall(text)
    if not numbers:
        return None
    return numbers[-1].replace(",", "").rstrip(".")


def gsm8k_answer(text: str | None) -> str | None:
    """The number after the last ``####``, else the last number in ``text``, commas removed."""
    hashes = _HASH_RE.findall(text or "")
    if hashes:
        return hashes[-1].replace(",", "")
    return last_number(text or "")


def extract_answer(text: str | None) -> str | None:
    """The final answer stated in a completion (see the module docstring), or None."""
    if not text:
        return None
    minerva = _MINERVA_RE.findall(text)
    if minerva:
        return minerva[-1].strip()
    if _last_box_is_open(text):
        return None  # the completion was cut inside its final box: no answer was given
    boxed = last_boxed(text)
    if boxed is not None:
        return boxed.strip()
    tags = _ANSWER_TAG_RE.findall(text)
    if tags:
        inner = tags[-1]
        anchored = anchored_answer(inner)
        return anchored if anchored is not None else inner.strip().strip("$").strip()
    anchored = anchored_answer(text)
    if anchored is not None:
        return anchored
    return last_number(text)


def anchored_answer(text: str) -> str | None:
    """The answer after the last "the answer is"/"answer:" or "####" marker, or None."""
    best = None
    best_pos = -1
    for m in _ANSWER_IS_RE.finditer(text):
        tail = _clean_tail(text[m.end():])
        if tail and m.start() > best_pos:
            best, best_pos = tail, m.start()
    for m in _HASH_RE.finditer(text):
        if m.start() > best_pos:
            best, best_pos = m.group(1).replace(",", ""), m.start()
    return best


def has_anchor(text: str) -> bool:
    """Whether ``text`` states its answer explicitly (box, tag, "the answer is", ####)."""
    return bool(_BOX_RE.search(text) or _MINERVA_RE.search(text) or "<answer>" in text
                or _ANSWER_IS_RE.search(text) or "####" in text)
