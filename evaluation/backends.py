"""HTTP clients for the served model: SGLang ``/generate`` (sglang-kvc or stock SGLang) and
OpenAI-compatible ``/v1/completions`` and ``/v1/chat/completions``.

Every backend returns a :class:`Completion` (text, finish reason, response tokens). Connection
errors, timeouts, HTTP 429 and 5xx are retried with exponential backoff; other HTTP errors
fail at once with the server's message.
"""

from __future__ import annotations

import asyncio
import dataclasses

import httpx

BACKENDS = ("auto", "sglang", "openai", "openai-chat")


@dataclasses.dataclass
class SamplingConfig:
    temperature: float = 0.8
    top_p: float = 0.95
    max_tokens: int = 4096
    stop: tuple[str, ...] = ()


@dataclasses.dataclass
class Completion:
    text: str
    finish_reason: str  # "stop", "length", "abort" or "error"
    response_tokens: int | None
    error: str | None = None


class BackendError(RuntimeError):
    """A request that failed for good (after retries, or with a non-retryable status)."""


class Backend:
    """Base class: subclasses build the request and parse the response."""

    path = ""

    def __init__(self, url: str, client: httpx.AsyncClient, model: str | None = None,
                 retries: int = 3, backoff: float = 1.0):
        self.url = url.rstrip("/")
        self.client = client
        self.model = model or "default"
        self.retries = retries
        self.backoff = backoff

    def payload(self, prompt, sampling: SamplingConfig, seed: int | None) -> dict:
        raise NotImplementedError

    def parse(self, data: dict) -> Completion:
        raise NotImplementedError

    async def complete(self, prompt, sampling: SamplingConfig, seed: int | None = None) -> Completion:
        body = self.payload(prompt, sampling, seed)
        last_error = ""
        for attempt in range(self.retries + 1):
            try:
                response = await self.client.post(self.url + self.path, json=body)
                if response.status_code == 200:
                    return self.parse(response.json())
                last_error = f"HTTP {response.status_code}: {response.text[:500]}"
                if response.status_code != 429 and response.status_code < 500:
                    raise BackendError(f"{self.url}{self.path} rejected the request: {last_error}")
            except (httpx.TransportError, httpx.TimeoutException) as exc:
                last_error = f"{type(exc).__name__}: {exc}"
            if attempt < self.retries:
                await asyncio.sleep(self.backoff * 2 ** attempt)
        raise BackendError(f"{self.url}{self.path} failed after {self.retries + 1} attempts: {last_error}")


class SGLangBackend(Backend):
    """SGLang native ``POST /generate`` with a text prompt."""

    path = "/generate"

    def payload(self, prompt, sampling, seed):
        params = {"temperature": sampling.temperature, "top_p": sampling.top_p,
                  "max_new_tokens": sampling.max_tokens}
        if sampling.stop:
            params["stop"] = list(sampling.stop)
        if seed is not None:
            params["sampling_seed"] = seed
        return {"text": prompt, "sampling_params": params}

    def parse(self, data):
        if isinstance(data, list):
            data = data[0]
        meta = data.get("meta_info") or {}
        reason = meta.get("finish_reason") or {}
        kind = reason.get("type") if isinstance(reason, dict) else str(reason)
        return Completion(data.get("text", ""), kind or "stop", meta.get("completion_tokens"))


class OpenAICompletionsBackend(Backend):
    """OpenAI-compatible ``POST /v1/completions`` with a text prompt."""

    path = "/v1/completions"

    def payload(self, prompt, sampling, seed):
        body = {"model": self.model, "prompt": prompt, "max_tokens": sampling.max_tokens,
                "temperature": sampling.temperature, "top_p": sampling.top_p, "n": 1}
        if sampling.stop:
            body["stop"] = list(sampling.stop)
        if seed is not None:
            body["seed"] = seed
        return body

    def parse(self, data):
        choice = data["choices"][0]
        usage = data.get("usage") or {}
        return Completion(choice.get("text") or "", choice.get("finish_reason") or "stop",
                          usage.get("completion_tokens"))


class OpenAIChatBackend(OpenAICompletionsBackend):
    """OpenAI-compatible ``POST /v1/chat/completions`` with messages (the server's template)."""

    path = "/v1/chat/completions"

    def payload(self, prompt, sampling, seed):
        body = super().payload(prompt, sampling, seed)
        del body["prompt"]
        body["messages"] = prompt
        return body

    def parse(self, data):
        choice = data["choices"][0]
        usage = data.get("usage") or {}
        message = choice.get("message") or {}
        text = message.get("content") or ""
        if message.get("reasoning_content"):
            text = f"<think>{message['reasoning_content']}</think>{text}"
        return Completion(text, choice.get("finish_reason") or "stop", usage.get("completion_tokens"))


async def detect_backend(url: str, client: httpx.AsyncClient) -> str:
    """``sglang`` if the server answers ``/get_model_info``, else ``openai`` if it answers
    ``/v1/models``; raises ``BackendError`` when it answers neither."""
    url = url.rstrip("/")
    for path, kind in (("/get_model_info", "sglang"), ("/v1/models", "openai")):
        try:
            response = await client.get(url + path)
        except (httpx.TransportError, httpx.TimeoutException):
            continue
        if response.status_code == 200:
            return kind
    raise BackendError(f"no SGLang (/get_model_info) or OpenAI (/v1/models) server answers at {url}")


async def detect_model(url: str, client: httpx.AsyncClient) -> str | None:
    """The first model id of ``/v1/models``, or None."""
    try:
        response = await client.get(url.rstrip("/") + "/v1/models")
        if response.status_code == 200:
            data = response.json().get("data") or []
            return data[0]["id"] if data else None
    except (httpx.TransportError, httpx.TimeoutException, ValueError, KeyError):
        return None
    return None


def make_backend(kind: str, url: str, client: httpx.AsyncClient, model: str | None,
                 retries: int = 3, backoff: float = 1.0) -> Backend:
    classes = {"sglang": SGLangBackend, "openai": OpenAICompletionsBackend, "openai-chat": OpenAIChatBackend}
    if kind not in classes:
        raise ValueError(f"unknown backend {kind!r}; choose from {sorted(classes)}")
    return classes[kind](url, client, model, retries, backoff)
