"""Run code in a notebook server's kernel through the hub's proxy, as a browser would."""

from __future__ import annotations

import asyncio
import json
import uuid

from tornado.httpclient import AsyncHTTPClient, HTTPRequest
from tornado.websocket import websocket_connect


def _message(code: str, session: str) -> tuple[str, str]:
    msg_id = uuid.uuid4().hex
    msg = {
        "header": {
            "msg_id": msg_id,
            "msg_type": "execute_request",
            "username": "e2e",
            "session": session,
            "version": "5.3",
            "date": "",
        },
        "parent_header": {},
        "metadata": {},
        "content": {"code": code, "silent": False, "store_history": False, "allow_stdin": False},
        "channel": "shell",
    }
    return msg_id, json.dumps(msg)


async def _run(base: str, token: str, code: str, timeout: float) -> str:
    headers = {"Authorization": f"token {token}"}
    http = AsyncHTTPClient()
    r = await http.fetch(
        f"{base}/api/kernels", method="POST", body="{}", headers=headers, request_timeout=60
    )
    kernel_id = json.loads(r.body)["id"]
    session = uuid.uuid4().hex
    ws_url = (
        base.replace("http://", "ws://", 1)
        + f"/api/kernels/{kernel_id}/channels?session_id={session}"
    )
    try:
        ws = await websocket_connect(HTTPRequest(ws_url, headers=headers, request_timeout=60))
        msg_id, payload = _message(code, session)
        await ws.write_message(payload)
        out: list[str] = []
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        while True:
            raw = await asyncio.wait_for(ws.read_message(), max(0.1, deadline - loop.time()))
            if raw is None:
                raise RuntimeError("the kernel's websocket closed")
            msg = json.loads(raw)
            if msg.get("parent_header", {}).get("msg_id") != msg_id:
                continue
            kind = msg["header"]["msg_type"]
            if kind == "stream":
                out.append(msg["content"]["text"])
            elif kind == "error":
                out.append("\n".join(msg["content"]["traceback"]))
            elif kind == "status" and msg["content"]["execution_state"] == "idle":
                break
        ws.close()
        return "".join(out)
    finally:
        await http.fetch(
            f"{base}/api/kernels/{kernel_id}", method="DELETE", headers=headers, raise_error=False
        )


def run_code(hub, user: str, code: str, server: str = "", timeout: float = 60) -> str:
    """Execute ``code`` in a new kernel of the user's server and return what it printed."""
    base = f"{hub.public_url}/user/{user}" + (f"/{server}" if server else "")
    return asyncio.run(_run(base, hub.token, code, timeout))
