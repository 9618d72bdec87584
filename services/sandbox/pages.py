"""crawl_page: a page by corpus document id, or by URL for allowlisted hosts only; readable
text extraction, a token budget, and an optional summary toward the caller's goal."""

from __future__ import annotations

import asyncio
import re
from dataclasses import dataclass
from html.parser import HTMLParser
from urllib.parse import urljoin, urlsplit

import httpx
from gearshift.errors import GearshiftError
from gearshift.policy_client import PolicyClient
from gearshift.services.sandbox.corpus import Corpus
from gearshift.services.sandbox.results import ToolFailure

MAX_REDIRECTS = 5
SKIPPED_TAGS = {"script", "style", "noscript", "nav", "header", "footer", "aside", "form", "svg", "template", "iframe"}
BLOCK_TAGS = {
    "p", "div", "br", "li", "ul", "ol", "h1", "h2", "h3", "h4", "h5", "h6", "tr", "table", "section",
    "article", "main", "blockquote", "pre", "dd", "dt", "hr",
}
_TOKEN = re.compile(r"\S+")
SUMMARY_PROMPT = (
    "You extract information from a web page for a research agent. Given the agent's goal and the "
    "page text, reply with the facts from the page that help with the goal, briefly, quoting numbers "
    "and names exactly. If nothing helps, say so in one sentence."
)


@dataclass(frozen=True)
class Page:
    """Readable text of one visited page."""

    source: str
    title: str
    text: str


class _Readable(HTMLParser):
    """Text of an HTML page without scripts, navigation and markup."""

    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.parts: list[str] = []
        self.title = ""
        self._skipping = 0
        self._in_title = False

    def handle_starttag(self, tag, attrs):
        if tag in SKIPPED_TAGS:
            self._skipping += 1
        elif tag == "title":
            self._in_title = True
        elif tag in BLOCK_TAGS:
            self.parts.append("\n")

    def handle_endtag(self, tag):
        if tag in SKIPPED_TAGS and self._skipping:
            self._skipping -= 1
        elif tag == "title":
            self._in_title = False
        elif tag in BLOCK_TAGS:
            self.parts.append("\n")

    def handle_data(self, data):
        if self._in_title:
            self.title += data
        elif not self._skipping:
            self.parts.append(data)


def readable_text(html: str) -> tuple[str, str]:
    """(title, text) of an HTML document, one paragraph per line."""
    parser = _Readable()
    parser.feed(html)
    parser.close()
    lines = (" ".join(line.split()) for line in "".join(parser.parts).splitlines())
    return " ".join(parser.title.split()), "\n".join(line for line in lines if line)


def truncate_tokens(text: str, budget: int) -> tuple[str, bool]:
    """The text cut after `budget` whitespace-separated tokens, and whether it was cut."""
    for count, match in enumerate(_TOKEN.finditer(text), start=1):
        if count == budget:
            end = match.end()
            rest = text[end:]
            if rest.strip():
                return text[:end] + f"\n[... page truncated to {budget} tokens ...]", True
            break
    return text, False


def host_allowed(host: str, allowlist: list[str]) -> bool:
    """Exact host match, or a subdomain of an entry that starts with a dot."""
    host = host.lower().rstrip(".")
    for entry in allowlist:
        entry = entry.lower()
        if host == entry.lstrip(".") or (entry.startswith(".") and host.endswith(entry)):
            return True
    return False


class PageVisitor:
    """Resolves an id or URL to readable text."""

    def __init__(self, corpus: Corpus, allowlist: list[str], max_bytes: int):
        self.corpus = corpus
        self.allowlist = allowlist
        self.max_bytes = max_bytes
        self._by_url = {doc.url: doc for doc in corpus.documents if doc.url}

    async def visit(self, target: str, timeout: float) -> Page:
        doc = self.corpus.get(target) or self._by_url.get(target)
        if doc is not None:
            return Page(doc.id, doc.title, doc.text)
        parts = urlsplit(target)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ToolFailure(f"{target!r} is neither a corpus document id nor an http(s) URL")
        return await self._fetch(target, timeout)

    async def _fetch(self, url: str, timeout: float) -> Page:
        async with httpx.AsyncClient(timeout=timeout, follow_redirects=False) as client:
            for _ in range(MAX_REDIRECTS + 1):
                host = urlsplit(url).hostname or ""
                if not host_allowed(host, self.allowlist):
                    raise ToolFailure(f"host {host!r} is not on the sandbox's URL allowlist")
                try:
                    async with client.stream("GET", url, headers={"User-Agent": "gearshift-sandbox"}) as reply:
                        if reply.is_redirect and "location" in reply.headers:
                            url = urljoin(url, reply.headers["location"])
                            continue
                        if reply.status_code != 200:
                            raise ToolFailure(f"{url} answered HTTP {reply.status_code}")
                        body = await self._read_capped(reply)
                        kind = reply.headers.get("content-type", "text/html").split(";")[0].strip().lower()
                        charset = reply.charset_encoding or "utf-8"
                except httpx.HTTPError as exc:
                    raise ToolFailure(f"could not fetch {url}: {type(exc).__name__}") from exc
                text = body.decode(charset, errors="replace")
                if kind in ("text/html", "application/xhtml+xml"):
                    title, text = readable_text(text)
                    return Page(url, title or url, text)
                if kind.startswith("text/"):
                    return Page(url, url, text)
                raise ToolFailure(f"{url} is {kind}, not a text page")
        raise ToolFailure(f"{url}: more than {MAX_REDIRECTS} redirects")

    async def _read_capped(self, reply: httpx.Response) -> bytes:
        body = bytearray()
        async for chunk in reply.aiter_bytes():
            body += chunk
            if len(body) > self.max_bytes:
                break  # the budget keeps only the start anyway
        return bytes(body[: self.max_bytes])


class PageSummarizer:
    """Summarises a page toward a goal with the policy model."""

    def __init__(self, policy: PolicyClient, max_tokens: int = 512):
        self.policy = policy
        self.max_tokens = max_tokens

    async def summarize(self, page: Page, goal: str, timeout: float) -> str:
        messages = [
            {"role": "system", "content": SUMMARY_PROMPT},
            {"role": "user", "content": f"Goal: {goal}\n\nPage: {page.title}\n{page.text}"},
        ]
        try:
            reply = await asyncio.wait_for(self.policy.chat(messages, max_tokens=self.max_tokens, temperature=0.0), timeout)
        except (GearshiftError, TimeoutError) as exc:
            raise ToolFailure(f"summary unavailable: {type(exc).__name__}") from exc
        return (reply.content or "").strip()
