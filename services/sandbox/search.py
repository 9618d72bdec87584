"""web_search: BM25 over the corpus, or a Serper-style HTTP backend (off by default)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

import httpx
from gearshift.services.sandbox.corpus import Corpus
from gearshift.services.sandbox.results import ToolFailure


@dataclass(frozen=True)
class SearchResult:
    """One result as the policy sees it."""

    title: str
    id: str
    snippet: str
    url: str = ""


class SearchBackend(Protocol):
    async def search(self, query: str, top_k: int) -> list[SearchResult]: ...


class CorpusSearch:
    """BM25 over the local corpus; ids can be passed to crawl_page."""

    def __init__(self, corpus: Corpus):
        self.corpus = corpus

    async def search(self, query: str, top_k: int) -> list[SearchResult]:
        return [SearchResult(h.document.title, h.document.id, h.snippet, h.document.url) for h in self.corpus.search(query, top_k)]


class SerperSearch:
    """A Serper-style endpoint: POST {"q", "num"} with X-API-KEY, results under "organic"."""

    def __init__(self, url: str, api_key: str, timeout: float):
        self.url, self.api_key, self.timeout = url, api_key, timeout

    async def search(self, query: str, top_k: int) -> list[SearchResult]:
        try:
            async with httpx.AsyncClient(timeout=self.timeout) as client:
                reply = await client.post(self.url, json={"q": query, "num": top_k}, headers={"X-API-KEY": self.api_key})
        except httpx.HTTPError as exc:
            raise ToolFailure(f"search backend unreachable: {type(exc).__name__}") from exc
        if reply.status_code != 200:
            raise ToolFailure(f"search backend answered HTTP {reply.status_code}")
        try:
            organic = reply.json().get("organic", [])
        except ValueError as exc:
            raise ToolFailure("search backend answered with something other than JSON") from exc
        return [
            SearchResult(str(item.get("title", "")), str(item.get("link", "")), str(item.get("snippet", "")), str(item.get("link", "")))
            for item in organic[:top_k]
            if isinstance(item, dict)
        ]


def format_results(query: str, results: list[SearchResult]) -> str:
    """The text the policy reads for one query."""
    if not results:
        return f"No results for {query!r}."
    lines = [f"Results for {query!r}:"]
    for rank, result in enumerate(results, start=1):
        lines.append(f"[{rank}] {result.title} (id: {result.id})")
        if result.url and result.url != result.id:
            lines.append(f"    {result.url}")
        lines.append(f"    {result.snippet}")
    return "\n".join(lines)
