"""The sandbox's tool dispatch, free of gRPC: argument checks, per-tool timeouts, the
concurrency limit and per-tool metrics around python, web_search and crawl_page."""

from __future__ import annotations

import asyncio
import json
import logging
import tempfile
import time
from dataclasses import dataclass, replace
from typing import Any, Awaitable, Callable

from gearshift.errors import InvalidArgument
from gearshift.policy_client import PolicyClient
from gearshift.services.sandbox.corpus import Corpus, corpus_dir_of, load_corpus
from gearshift.services.sandbox.pages import PageSummarizer, PageVisitor, truncate_tokens
from gearshift.services.sandbox.python_tool import PythonTool, Sessions
from gearshift.services.sandbox.results import ToolFailure, ToolOutput
from gearshift.services.sandbox.search import CorpusSearch, SearchBackend, SerperSearch, format_results
from gearshift.services.sandbox.workers import UidAllocator, WarmPool, WorkerLimits, Zygote
from gearshift.settings import Settings
from prometheus_client import Counter, Gauge, Histogram

log = logging.getLogger("gearshift.sandbox")

TOOL_CALLS = Counter("sandbox_tool_calls_total", "Tool calls by outcome", ["tool", "outcome"])
TOOL_ERRORS = Counter("sandbox_tool_errors_total", "Tool calls that returned is_error", ["tool"])
TOOL_SECONDS = Histogram(
    "sandbox_tool_seconds", "Tool call wall time", ["tool"],
    buckets=(0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30),
)
WARM_WORKERS = Gauge("sandbox_warm_workers", "Isolated python workers ready")
LIVE_SESSIONS = Gauge("sandbox_live_sessions", "Live stateful python sessions")
# What the sandbox's load is (of max_concurrency slots): autoscaling reads it.
BUSY_WORKERS = Gauge("sandbox_busy_workers", "Tool calls running (holding one of the max_concurrency slots)")
MAX_PAGES_PER_CALL = 5
MAX_QUERIES_PER_CALL = 5


@dataclass(frozen=True)
class ToolDescription:
    """A tool in the OpenAI function-calling form."""

    name: str
    description: str
    parameters: dict


TOOLS = (
    ToolDescription(
        "python",
        "Run Python 3 code in an isolated sandbox without network access and return what it prints; "
        "the value of a final expression is printed too. Only the standard library is guaranteed.",
        {"type": "object", "properties": {"code": {"type": "string", "description": "The Python code to run"}},
         "required": ["code"], "additionalProperties": False},
    ),
    ToolDescription(
        "web_search",
        "Search for documents. Returns titles, ids and snippets; pass an id or URL to crawl_page to read a result.",
        {"type": "object", "properties": {
            "query": {"anyOf": [{"type": "string"}, {"type": "array", "items": {"type": "string"}}],
                      "description": "A query, or a few queries"},
            "top_k": {"type": "integer", "minimum": 1, "description": "Results per query"}},
         "required": ["query"], "additionalProperties": False},
    ),
    ToolDescription(
        "crawl_page",
        "Read pages by document id (from web_search) or URL, optionally focused on a goal.",
        {"type": "object", "properties": {
            "urls": {"type": "array", "items": {"type": "string"}, "description": "Document ids or URLs"},
            "url": {"type": "string", "description": "One document id or URL"},
            "id": {"type": "string", "description": "One document id"},
            "query": {"type": "string", "description": "What the pages should be read for"}},
         "additionalProperties": False},
    ),
)


def _isolation_config(settings: Settings) -> dict:
    """What the zygote needs: import paths, modules to preload, and what to do without isolation."""
    sandbox = settings.sandbox
    return {
        "import_paths": [str(p.resolve()) for p in sandbox.import_paths],
        "preload": list(sandbox.preload_modules),
        "fallback_tmp": tempfile.gettempdir(),
        "allow_insecure": sandbox.allow_insecure,
    }


def _limits(settings: Settings, cpu_seconds: int) -> WorkerLimits:
    s = settings.sandbox
    return WorkerLimits(
        cpu_seconds=cpu_seconds, memory_mb=s.memory_mb, file_mb=s.file_mb, max_processes=s.max_processes,
        max_open_files=s.max_open_files, tmp_mb=s.tmp_mb, tmp_inodes=s.tmp_inodes,
    )


def log_isolation(report: dict, allow_insecure: bool) -> str:
    """Says at startup what holds, and loudly what does not; returns why python is refused
    ("" when python runs)."""
    if report.get("isolated"):
        allow = report.get("allowlist", {})
        log.info(
            "sandbox isolation: every python call in its own namespaces (%s mode) and allowlisted root "
            "(%d directories, %d files), seccomp filter, %s, /proc %s",
            report["mode"], len(allow.get("dirs", [])), len(allow.get("files", [])),
            "per-call memory and pids cgroups" if report.get("cgroups") else "no writable cgroups: rlimits and the service's watchdog",
            "private" if report.get("proc") else "absent (this runtime refuses a fresh proc mount)",
        )
        return ""
    reason = report.get("reason") or "unknown"
    if allow_insecure:
        log.critical(
            "INSECURE: python code runs WITHOUT isolation (%s) and sees the host's files and sockets as the "
            "service's user does; allowed by GEARSHIFT_SANDBOX__ALLOW_INSECURE", reason,
        )
        return ""
    log.error("python calls are refused: %s. See docs/sandbox.md (user namespaces), or set "
              "GEARSHIFT_SANDBOX__ALLOW_INSECURE=true to run code unisolated (unsafe)", reason)
    return f"python is disabled: the sandbox cannot isolate code on this machine ({reason})"


class Sandbox:
    """Runs tool calls: checks the request, applies timeouts and the concurrency limit, records metrics."""

    def __init__(self, settings: Settings, corpus: Corpus, search: SearchBackend, zygote: Zygote,
                 pool: WarmPool, sessions: Sessions, summarizer: PageSummarizer | None, python_refusal: str = ""):
        self.settings = settings.sandbox
        self.corpus = corpus
        self.search_backend = search
        self.zygote = zygote
        self.pool = pool
        self.sessions = sessions
        self.python = PythonTool(pool, sessions, self.settings.max_output_chars, python_refusal)
        self.pages = PageVisitor(corpus, self.settings.url_allowlist, self.settings.max_page_bytes)
        self.summarizer = summarizer
        self._slots = asyncio.Semaphore(self.settings.max_concurrency)
        self._busy = 0
        self._tools: dict[str, tuple[float, Callable[[dict, float, str, str, bool], Awaitable[ToolOutput]]]] = {
            "python": (self.settings.timeout_seconds, self._python),
            "web_search": (self.settings.search_timeout_seconds, self._web_search),
            "crawl_page": (self.settings.page_timeout_seconds, self._crawl_page),
        }
        WARM_WORKERS.set_function(lambda: self.pool.warm)
        LIVE_SESSIONS.set_function(lambda: len(self.sessions))
        BUSY_WORKERS.set_function(lambda: self._busy)

    @classmethod
    async def create(cls, settings: Settings) -> "Sandbox":
        """Loads the corpus, starts the zygote and the warm pool."""
        s = settings.sandbox
        corpus = load_corpus(corpus_dir_of(settings), s.include_sample_corpus)
        if s.search_backend == "serper":
            if s.serper_api_key is None:
                raise ValueError("search_backend=serper needs GEARSHIFT_SANDBOX__SERPER_API_KEY")
            search: SearchBackend = SerperSearch(s.serper_url, s.serper_api_key.get_secret_value(), s.search_timeout_seconds)
        elif s.search_backend == "bm25":
            search = CorpusSearch(corpus)
        else:
            raise ValueError(f"unknown search_backend {s.search_backend!r} (bm25 or serper)")
        limits = _limits(settings, s.cpu_seconds)
        zygote = Zygote(_isolation_config(settings), UidAllocator(s.uid_base, s.uid_count), limits)
        refusal = log_isolation(await zygote.start(), s.allow_insecure)
        pool = WarmPool(zygote, limits, 0 if refusal else s.warm_workers)
        pool.start()
        sessions = Sessions(zygote, _limits(settings, s.session_cpu_seconds), s.max_sessions, s.session_idle_seconds)
        sessions.start()
        summarizer = PageSummarizer(PolicyClient.from_settings(settings)) if s.summarize_pages else None
        log.info("sandbox corpus: %d documents; search backend %s; %d warm workers", len(corpus), s.search_backend, s.warm_workers)
        return cls(settings, corpus, search, zygote, pool, sessions, summarizer, refusal)

    def tools(self) -> tuple[ToolDescription, ...]:
        return TOOLS

    async def execute(self, name: str, arguments_json: str, timeout: float = 0.0,
                      session_id: str = "", trajectory_id: str = "", open_session: bool = False) -> ToolOutput:
        """Runs one call. Bad requests raise InvalidArgument; tool failures come back in the output."""
        if name not in self._tools:
            raise InvalidArgument(f"unknown tool {name!r}; tools: {', '.join(self._tools)}")
        arguments = self._parse_arguments(arguments_json)
        default_timeout, run = self._tools[name]
        if timeout < 0 or timeout != timeout:
            raise InvalidArgument("timeout_seconds must be positive")
        if timeout > self.settings.max_timeout_seconds:
            raise InvalidArgument(f"timeout_seconds above the cap of {self.settings.max_timeout_seconds:g}")
        if session_id and name != "python":
            raise InvalidArgument("session_id applies to the python tool only")
        if open_session and not session_id:
            raise InvalidArgument("open_session needs a session_id")
        if name == "python" and len(str(arguments.get("code", ""))) > self.settings.max_code_chars:
            raise InvalidArgument(f"code longer than {self.settings.max_code_chars} characters")
        timeout = timeout or default_timeout

        started = time.perf_counter()
        async with self._slots:
            self._busy += 1
            try:
                result = await run(arguments, timeout, session_id, trajectory_id, open_session)
            except ToolFailure as exc:
                result = ToolOutput("", is_error=True, error=str(exc))
            finally:
                self._busy -= 1
        result.wall_seconds = time.perf_counter() - started
        TOOL_SECONDS.labels(name).observe(result.wall_seconds)
        TOOL_CALLS.labels(name, "error" if result.is_error else "ok").inc()
        if result.is_error:
            TOOL_ERRORS.labels(name).inc()
        return result

    @staticmethod
    def _parse_arguments(arguments_json: str) -> dict[str, Any]:
        try:
            arguments = json.loads(arguments_json) if arguments_json.strip() else {}
        except json.JSONDecodeError as exc:
            raise InvalidArgument(f"arguments_json does not parse: {exc.msg} at position {exc.pos}") from exc
        if not isinstance(arguments, dict):
            raise InvalidArgument("arguments_json must be a JSON object")
        return arguments

    async def close_session(self, session_id: str) -> bool:
        if not session_id:
            raise InvalidArgument("session_id is empty")
        return self.sessions.close(session_id)

    async def close(self) -> None:
        await self.sessions.close_all()
        await self.pool.close()
        await self.zygote.stop()
        if self.summarizer is not None:
            await self.summarizer.policy.aclose()

    # --- the tools -------------------------------------------------------------------------

    async def _python(self, arguments: dict, timeout: float, session_id: str, trajectory_id: str, open_session: bool) -> ToolOutput:
        code = arguments.get("code")
        if not isinstance(code, str):
            raise ToolFailure('python needs {"code": "<python source>"}')
        unknown = set(arguments) - {"code"}
        if unknown:
            raise ToolFailure(f"python takes only \"code\", not {', '.join(sorted(unknown))}")
        return await self.python.run(code, timeout, session_id, trajectory_id, open_session)

    async def _web_search(self, arguments: dict, timeout: float, _session: str, _trajectory: str, _open: bool) -> ToolOutput:
        query = arguments.get("query")
        queries = [query] if isinstance(query, str) else query
        if not isinstance(queries, list) or not queries or not all(isinstance(q, str) and q.strip() for q in queries):
            raise ToolFailure('web_search needs {"query": "<text>"} or a list of queries')
        if len(queries) > MAX_QUERIES_PER_CALL:
            raise ToolFailure(f"at most {MAX_QUERIES_PER_CALL} queries per call")
        top_k = arguments.get("top_k", self.settings.search_top_k)
        if not isinstance(top_k, int) or isinstance(top_k, bool) or not 1 <= top_k <= self.settings.max_top_k:
            raise ToolFailure(f"top_k must be an integer from 1 to {self.settings.max_top_k}")
        try:
            found = await asyncio.wait_for(
                asyncio.gather(*(self.search_backend.search(q, top_k) for q in queries)), timeout
            )
        except asyncio.TimeoutError as exc:
            raise ToolFailure(f"search timed out after {timeout:g} s") from exc
        return ToolOutput("\n\n".join(format_results(q, r) for q, r in zip(queries, found)))

    async def _crawl_page(self, arguments: dict, timeout: float, _session: str, _trajectory: str, _open: bool) -> ToolOutput:
        targets = arguments.get("urls")
        if targets is None:
            single = arguments.get("url", arguments.get("id"))
            targets = [single] if single is not None else None
        if not isinstance(targets, list) or not targets or not all(isinstance(t, str) and t.strip() for t in targets):
            raise ToolFailure('crawl_page needs {"urls": [...]} or {"url": "..."} or {"id": "..."}')
        if len(targets) > MAX_PAGES_PER_CALL:
            raise ToolFailure(f"at most {MAX_PAGES_PER_CALL} pages per call")
        goal = arguments.get("query") or arguments.get("goal") or ""
        if not isinstance(goal, str):
            raise ToolFailure("query must be a string")
        try:
            sections = await asyncio.wait_for(asyncio.gather(*(self._read_page(t.strip(), goal, timeout) for t in targets)), timeout)
        except asyncio.TimeoutError as exc:
            raise ToolFailure(f"page visit timed out after {timeout:g} s") from exc
        failures = [error for _text, _cut, error in sections if error]
        output = "\n\n".join(text for text, _cut, _error in sections)
        if len(failures) == len(sections):
            return ToolOutput(output, is_error=True, error=failures[0] if len(failures) == 1 else f"{failures[0]} (and {len(failures) - 1} more)")
        return ToolOutput(output, truncated=any(cut for _text, cut, _error in sections))

    async def _read_page(self, target: str, goal: str, timeout: float) -> tuple[str, bool, str]:
        """(text for the policy, truncated, error) for one page; errors stay per page."""
        try:
            page = await self.pages.visit(target, timeout)
        except ToolFailure as exc:
            return f"[{target}] error: {exc}", False, str(exc)
        text, cut = truncate_tokens(page.text, self.settings.page_token_budget)
        header = f"[{page.source}] {page.title}"
        if self.summarizer is not None and goal:
            try:
                summary = await self.summarizer.summarize(replace(page, text=text), goal, timeout)
                return f"{header}\nSummary toward the goal: {summary}", cut, ""
            except ToolFailure as exc:
                header += f" ({exc}; showing the page text)"
        return f"{header}\n{text}", cut, ""
