"""The sandbox's tools over real gRPC on loopback: python (one-shot and sessions), web_search,
crawl_page, and the requests it refuses."""

from __future__ import annotations

import asyncio
import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import grpc
import pytest
from gearshift.api.common.v1.common_pb2 import ToolCall
from gearshift.api.sandbox.v1 import sandbox_pb2, sandbox_pb2_grpc
from gearshift.clients import channel
from gearshift.server import running
from gearshift.services.sandbox.service import build
from prometheus_client import REGISTRY

from tests.services.sandbox.conftest import call, run_python, sandbox_settings


async def test_list_tools_describes_the_three_tools(sandbox):
    _, stub = sandbox
    reply = await stub.ListTools(sandbox_pb2.ListToolsRequest())
    tools = {t.name: t for t in reply.tools}
    assert set(tools) == {"python", "web_search", "crawl_page"}
    assert json.loads(tools["python"].parameters_json_schema)["required"] == ["code"]
    assert all(t.description for t in reply.tools)


async def test_python_prints_and_shows_the_last_expression(sandbox):
    _, stub = sandbox
    result = await run_python(stub, "import math\nprint('hi')\nmath.factorial(20)")
    assert not result.is_error, result.error
    assert result.output == "hi\n2432902008176640000\n"
    assert result.name == "python" and result.call_id == "c1"
    assert 0 < result.wall_seconds < 2 and result.cpu_seconds >= 0


async def test_python_exception_is_a_tool_error_with_a_one_line_reason(sandbox):
    _, stub = sandbox
    result = await run_python(stub, "x = 1\ny = x / 0")
    assert result.is_error
    assert result.error == "ZeroDivisionError: division by zero"
    assert 'File "<code>", line 2' in result.output and "runner" not in result.output


async def test_python_syntax_error_and_exit_codes(sandbox):
    _, stub = sandbox
    result = await run_python(stub, "def f(:\n  pass")
    assert result.is_error and result.error.startswith("SyntaxError")
    assert (await run_python(stub, "import sys; sys.exit(0)")).is_error is False
    assert (await run_python(stub, "import sys; sys.exit(3)")).error == "SystemExit: 3"


async def test_python_timeout_keeps_output_printed_before_it(sandbox):
    _, stub = sandbox
    result = await run_python(stub, "print('started', flush=True)\nwhile True: pass", timeout=0.5)
    assert result.is_error and result.error == "timed out after 0.5 s"
    assert result.output.startswith("started")
    assert 0.5 <= result.wall_seconds < 1.5


async def test_the_standard_library_works_in_the_allowlisted_root(sandbox):
    _, stub = sandbox
    result = await run_python(stub, "import ctypes, decimal, hashlib, sqlite3, ssl, subprocess, sys, zlib\n"
                                    "child = subprocess.run([sys.executable, '-c', 'print(6 * 7)'], capture_output=True, text=True)\n"
                                    "callback = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_int)(lambda x: x + 1)\n"
                                    "print(child.stdout.strip(), callback(1), sqlite3.connect(':memory:').execute('select 1').fetchone(),\n"
                                    "      zlib.decompress(zlib.compress(b'ok')), hashlib.sha256(b'').hexdigest()[:8], ssl.OPENSSL_VERSION[:7])")
    assert not result.is_error, result.output
    assert result.output == "42 2 (1,) b'ok' e3b0c442 OpenSSL\n"


async def test_fresh_interpreter_per_call_without_a_session(sandbox):
    _, stub = sandbox
    await run_python(stub, "secret = 42\nopen('left-behind.txt', 'w').write('x')")
    result = await run_python(stub, "import os\nprint('secret' in globals(), os.listdir('.'))")
    assert result.output == "False []\n"


async def test_session_keeps_variables_until_closed(sandbox):
    _, stub = sandbox
    first = await run_python(stub, "total = 40\nopen('notes.txt', 'w').write('kept')", session_id="s-keep", open_session=True)
    assert not first.is_error, first.error
    second = await run_python(stub, "total += 2\nprint(total, open('notes.txt').read())", session_id="s-keep")
    assert second.output == "42 kept\n"
    failing = await run_python(stub, "raise ValueError('oops')", session_id="s-keep")
    assert failing.is_error and failing.error == "ValueError: oops"
    assert (await run_python(stub, "total", session_id="s-keep")).output == "42\n"  # an exception keeps the session

    closed = await stub.CloseSession(sandbox_pb2.CloseSessionRequest(session_id="s-keep"))
    assert closed.closed
    again = await stub.CloseSession(sandbox_pb2.CloseSessionRequest(session_id="s-keep"))
    assert not again.closed
    with pytest.raises(grpc.aio.AioRpcError) as err:  # closed: never silently run in an empty one
        await run_python(stub, "print('total' in globals())", session_id="s-keep")
    assert err.value.code() == grpc.StatusCode.NOT_FOUND and "not open on this sandbox replica" in err.value.details()
    fresh = await run_python(stub, "print('total' in globals())", session_id="s-keep", open_session=True)
    assert fresh.output == "False\n"
    await stub.CloseSession(sandbox_pb2.CloseSessionRequest(session_id="s-keep"))


async def test_a_session_is_opened_only_on_request_and_names_its_replica(sandbox):
    settings, stub = sandbox
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await run_python(stub, "x = 1", session_id="s-never-opened")
    assert err.value.code() == grpc.StatusCode.NOT_FOUND
    reply = await stub.Execute(sandbox_pb2.ExecuteRequest(
        call=ToolCall(id="c", name="python", arguments_json='{"code": "x = 1"}'), session_id="s-opened", open_session=True))
    assert not reply.result.is_error, reply.result.error
    assert reply.replica == f"{settings.host}:{settings.service_port('sandbox')}"  # none advertised: host:port
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await call(stub, "python", {"code": "pass"}, open_session=True)
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    await stub.CloseSession(sandbox_pb2.CloseSessionRequest(session_id="s-opened"))


async def test_session_belongs_to_its_trajectory_and_ends_on_timeout(sandbox):
    _, stub = sandbox
    await run_python(stub, "a = 1", session_id="s-owned", trajectory_id="t-a", open_session=True)
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await run_python(stub, "print(a)", session_id="s-owned", trajectory_id="t-b")
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    timed_out = await run_python(stub, "while True: pass", session_id="s-owned", trajectory_id="t-a", timeout=0.3)
    assert timed_out.is_error and "session was closed" in timed_out.error
    with pytest.raises(grpc.aio.AioRpcError) as err:  # the timeout closed it
        await run_python(stub, "print('a' in globals())", session_id="s-owned", trajectory_id="t-a")
    assert err.value.code() == grpc.StatusCode.NOT_FOUND
    await stub.CloseSession(sandbox_pb2.CloseSessionRequest(session_id="s-owned"))


async def test_live_sessions_are_capped(sandbox):
    settings, stub = sandbox
    cap = settings.sandbox.max_sessions
    for i in range(cap):
        assert not (await run_python(stub, "x = 1", session_id=f"cap-{i}", open_session=True)).is_error
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await run_python(stub, "x = 1", session_id="cap-over", open_session=True)
    assert err.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    for i in range(cap):
        assert (await stub.CloseSession(sandbox_pb2.CloseSessionRequest(session_id=f"cap-{i}"))).closed


async def test_idle_sessions_expire(tmp_path):
    settings = sandbox_settings(tmp_path, session_idle_seconds=0.4, warm_workers=1)
    async with running(await build(settings), settings) as server:
        async with channel(f"127.0.0.1:{server.port}", settings) as ch:
            stub = sandbox_pb2_grpc.SandboxStub(ch)
            await run_python(stub, "kept = 1", session_id="idle", open_session=True)
            await asyncio.sleep(1.0)
            closed = await stub.CloseSession(sandbox_pb2.CloseSessionRequest(session_id="idle"))
            assert not closed.closed  # the reaper got there first


@pytest.mark.parametrize(
    ("tool", "arguments", "timeout", "fragment"),
    [
        ("shell", {"cmd": "ls"}, 0, "unknown tool"),
        ("python", "{not json", 0, "does not parse"),
        ("python", "[1, 2]", 0, "JSON object"),
        ("python", {"code": "x = 1\n" * 10_000}, 0, "longer than"),
        ("python", {"code": "pass"}, 21.0, "above the cap"),
        ("python", {"code": "pass"}, -1.0, "positive"),
    ],
)
async def test_bad_requests_are_invalid_argument(sandbox, tool, arguments, timeout, fragment):
    _, stub = sandbox
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await call(stub, tool, arguments, timeout=timeout)
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert fragment in err.value.details()


async def test_wrong_argument_shapes_are_tool_errors(sandbox):
    _, stub = sandbox
    assert (await call(stub, "python", {"source": "1"})).is_error
    assert (await call(stub, "web_search", {"query": ""})).is_error
    assert (await call(stub, "web_search", {"query": "x", "top_k": 0})).is_error
    result = await call(stub, "crawl_page", {})
    assert result.is_error and "urls" in result.error


async def test_web_search_ranks_the_corpus(sandbox):
    _, stub = sandbox
    result = await call(stub, "web_search", {"query": "who discovered penicillin", "top_k": 2})
    assert not result.is_error
    first = result.output.splitlines()[1]
    assert first.startswith("[1] Penicillin (id: penicillin)")
    assert "Alexander Fleming" in result.output
    assert result.output.count("(id: ") == 2
    several = await call(stub, "web_search", {"query": ["capital of Australia", "tallest mountain"]})
    assert "(id: canberra)" in several.output and "(id: mount-everest)" in several.output
    nothing = await call(stub, "web_search", {"query": "zzzqqq"})
    assert not nothing.is_error and nothing.output.startswith("No results")


async def test_crawl_page_by_id_and_by_url_of_a_corpus_document(sandbox):
    _, stub = sandbox
    by_id = await call(stub, "crawl_page", {"id": "canberra"})
    assert not by_id.is_error and "Canberra is the capital city of Australia" in by_id.output
    by_url = await call(stub, "crawl_page", {"urls": ["https://en.wikipedia.org/wiki/Canberra", "no-such-doc"]})
    assert not by_url.is_error  # one page of two failed: reported inline
    assert "Canberra is the capital" in by_url.output and "[no-such-doc] error:" in by_url.output
    truncated = await call(stub, "crawl_page", {"url": "dna"})
    assert truncated.truncated and "[... page truncated to 30 tokens ...]" in truncated.output


async def test_crawl_page_refuses_hosts_off_the_allowlist(sandbox):
    _, stub = sandbox
    result = await call(stub, "crawl_page", {"url": "http://127.0.0.1:5432/"})
    assert result.is_error and "not on the sandbox's URL allowlist" in result.error


class _Site(BaseHTTPRequestHandler):
    """A loopback web site: an article, a redirect off the allowlist, and a chat-completions endpoint."""

    def do_GET(self):
        if self.path == "/away":
            self.send_response(302)
            self.send_header("Location", "http://localhost.invalid/page")
            self.end_headers()
            return
        body = (
            "<html><head><title>Test article</title><script>var hidden = 1;</script></head><body>"
            "<nav>Menu Home About</nav><h1>Otters</h1><p>Sea otters hold hands while sleeping.</p>"
            "<p>They use rocks as tools.</p><footer>Copyright</footer></body></html>"
        ).encode()
        self.send_response(200)
        self.send_header("Content-Type", "text/html; charset=utf-8")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_POST(self):
        request = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        if self.path == "/search":
            reply = {"organic": [{"title": f"Hit for {request['q']}", "link": "https://example.org/a", "snippet": "S"}]}
        else:
            goal = request["messages"][1]["content"].split("\n")[0]
            reply = {"choices": [{"message": {"role": "assistant", "content": f"summary for {goal}"}}]}
        body = json.dumps(reply).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass


@pytest.fixture
def site():
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Site)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


async def test_allowlisted_pages_are_fetched_as_readable_text_and_summarised(tmp_path, site):
    # The loopback site stands in for the web and for the policy's chat-completions endpoint.
    settings = sandbox_settings(tmp_path, url_allowlist=["127.0.0.1"], warm_workers=0, summarize_pages=True)
    settings = settings.with_policy(f"{site}/v1")
    async with running(await build(settings), settings) as server:
        async with channel(f"127.0.0.1:{server.port}", settings) as ch:
            stub = sandbox_pb2_grpc.SandboxStub(ch)
            page = await call(stub, "crawl_page", {"url": f"{site}/otters"})
            assert not page.is_error, page.error
            assert "Test article" in page.output and "Sea otters hold hands while sleeping." in page.output
            assert "var hidden" not in page.output and "Menu Home" not in page.output and "Copyright" not in page.output
            summary = await call(stub, "crawl_page", {"url": f"{site}/otters", "query": "what otters use"})
            assert "Summary toward the goal: summary for Goal: what otters use" in summary.output
            redirected = await call(stub, "crawl_page", {"url": f"{site}/away"})
            assert redirected.is_error and "'localhost.invalid' is not on the sandbox's URL allowlist" in redirected.error


async def test_serper_backend_when_configured(tmp_path, site):
    settings = sandbox_settings(tmp_path, search_backend="serper", serper_url=f"{site}/search", serper_api_key="k", warm_workers=0)
    async with running(await build(settings), settings) as server:
        async with channel(f"127.0.0.1:{server.port}", settings) as ch:
            result = await call(sandbox_pb2_grpc.SandboxStub(ch), "web_search", {"query": "otters"})
            assert not result.is_error and "[1] Hit for otters (id: https://example.org/a)" in result.output


async def test_metrics_count_calls_errors_and_latency_per_tool(sandbox):
    _, stub = sandbox

    def sample(name: str, **labels) -> float:
        return REGISTRY.get_sample_value(name, labels) or 0.0

    before = (sample("sandbox_tool_calls_total", tool="web_search", outcome="ok"),
              sample("sandbox_tool_errors_total", tool="python"), sample("sandbox_tool_seconds_count", tool="python"))
    await call(stub, "web_search", {"query": "otters"})
    await run_python(stub, "1/0")
    after = (sample("sandbox_tool_calls_total", tool="web_search", outcome="ok"),
             sample("sandbox_tool_errors_total", tool="python"), sample("sandbox_tool_seconds_count", tool="python"))
    assert [b - a for a, b in zip(before, after)] == [1, 1, 1]


async def test_concurrency_limit_queues_calls(tmp_path):
    settings = sandbox_settings(tmp_path, max_concurrency=1, warm_workers=2)
    async with running(await build(settings), settings) as server:
        async with channel(f"127.0.0.1:{server.port}", settings) as ch:
            stub = sandbox_pb2_grpc.SandboxStub(ch)
            started = time.perf_counter()
            results = await asyncio.gather(*(run_python(stub, "import time; time.sleep(0.3)") for _ in range(3)))
            assert all(not r.is_error for r in results)
            assert time.perf_counter() - started >= 0.9


async def test_a_dead_zygote_is_restarted(tmp_path):
    settings = sandbox_settings(tmp_path, warm_workers=0)
    service = await build(settings)
    sandbox = service.handlers[0].servicer.sandbox
    async with running(service, settings) as server:
        async with channel(f"127.0.0.1:{server.port}", settings) as ch:
            stub = sandbox_pb2_grpc.SandboxStub(ch)
            assert (await run_python(stub, "print(1)")).output == "1\n"
            sandbox.zygote._process.kill()
            await sandbox.zygote._process.wait()
            assert (await run_python(stub, "print(2)")).output == "2\n"
