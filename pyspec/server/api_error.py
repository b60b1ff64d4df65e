"""The refusal every layer of the server raises: OpenAI's error object and an
HTTP status (the dialects of pyspec/wire/ raise it where requests are read)."""

from __future__ import annotations

from typing import Any, Dict, Optional


class APIError(Exception):
    """A request the server refuses, as OpenAI's error object and an HTTP status."""

    def __init__(self, status: int, message: str, *, param: Optional[str] = None,
                 type: str = "invalid_request_error", code: Optional[str] = None,
                 headers: Optional[Dict[str, str]] = None) -> None:
        super().__init__(message)
        self.status, self.message, self.param, self.type, self.code = status, message, param, type, code
        self.headers = headers or {}

    def body(self) -> Dict[str, Any]:
        return {"error": {"message": self.message, "type": self.type, "param": self.param, "code": self.code}}
