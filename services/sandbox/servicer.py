"""Sandbox servicer: protobuf <-> Sandbox."""

from __future__ import annotations

import json

from gearshift.api.common.v1.common_pb2 import ToolResult
from gearshift.api.sandbox.v1 import sandbox_pb2, sandbox_pb2_grpc
from gearshift.errors import InvalidArgument
from gearshift.services.sandbox.core import Sandbox


class SandboxServicer(sandbox_pb2_grpc.SandboxServicer):
    def __init__(self, sandbox: Sandbox, replica: str):
        self.sandbox = sandbox
        self.replica = replica  # where this replica is reached, for a session's later calls

    async def Execute(self, request: sandbox_pb2.ExecuteRequest, context) -> sandbox_pb2.ExecuteResponse:
        if not request.HasField("call") or not request.call.name:
            raise InvalidArgument("call.name is empty")
        call = request.call
        result = await self.sandbox.execute(
            call.name, call.arguments_json, request.timeout_seconds, request.session_id, request.trajectory_id, request.open_session
        )
        return sandbox_pb2.ExecuteResponse(
            result=ToolResult(
                call_id=call.id, name=call.name, output=result.output, is_error=result.is_error, error=result.error,
                wall_seconds=result.wall_seconds, cpu_seconds=result.cpu_seconds, truncated=result.truncated,
            ),
            replica=self.replica,
        )

    async def ListTools(self, request: sandbox_pb2.ListToolsRequest, context) -> sandbox_pb2.ListToolsResponse:
        return sandbox_pb2.ListToolsResponse(
            tools=[
                sandbox_pb2.ToolSpec(name=t.name, description=t.description, parameters_json_schema=json.dumps(t.parameters))
                for t in self.sandbox.tools()
            ]
        )

    async def CloseSession(self, request: sandbox_pb2.CloseSessionRequest, context) -> sandbox_pb2.CloseSessionResponse:
        return sandbox_pb2.CloseSessionResponse(closed=await self.sandbox.close_session(request.session_id))
