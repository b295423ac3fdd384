"""Optional JSONL fields that tie a request to its generated tokens and to earlier requests.

- ``output_token_ids``: the tokens the request generated, when recorded (one per output token);
  they are hashed like prompt tokens, so a later prompt that resends them hits their blocks.
- ``request_id`` (string or integer): a name other lines can refer to;
- ``continues``: the ``request_id`` of an earlier line whose whole sequence (its prompt, then
  its ``output_tokens`` generated tokens) this prompt starts with, followed by new tokens:
  multi-turn without token ids (length-only and Mooncake-style lines). ``prompt_tokens`` must
  be at least the earlier request's prompt + output, and it may not arrive before that
  request; a line with ``prompt_token_ids`` names its content already and may not use it.

:class:`Links` reads them line by line and remembers the named requests of the file (every one,
so a request outside a ``--start``/``--limit`` window can still be continued).
"""

from __future__ import annotations

from kvsim.workloads import fields as F
from kvsim.workloads.request import Request


class Links:
    """The named requests seen so far in one file."""

    def __init__(self) -> None:
        self._named: dict[str, tuple[Request, int]] = {}    # name -> (request, line number)

    def read(self, record: dict, loc: str, line_no: int, request: Request) -> None:
        """Apply ``record``'s optional link fields to ``request`` (parsed from line ``loc``)."""
        request.request_id = -line_no       # distinct until the loader numbers kept requests
        _outputs(record, loc, request)
        parent = record.get("continues")
        if parent is not None:
            request.continues = self._parent(F.label(parent, "continues", loc), loc, request)
        name = record.get("request_id")
        request.may_be_continued = name is not None     # only a named line can be continued
        if name is not None:
            self._name(F.label(name, "request_id", loc), loc, line_no, request)

    def _parent(self, name: str, loc: str, request: Request) -> Request:
        if name not in self._named:
            raise F.fail(loc, "continues", f"no earlier line has request_id {name!r}")
        if request.prompt_token_ids is not None:
            raise F.fail(loc, "continues", "give prompt_token_ids or continues, not both "
                                           "(token ids already name the whole prompt)")
        parent = self._named[name][0]
        if request.arrival_s < parent.arrival_s:      # (a --sort would put it first)
            raise F.fail(loc, "continues", f"arrives at {request.arrival_s:g} s, before the "
                         f"continued request {name!r} ({parent.arrival_s:g} s): a "
                         "continuation starts with that request's output")
        whole = parent.prompt_tokens + parent.output_tokens
        if request.prompt_tokens < whole:
            raise F.fail(loc, "prompt_tokens", f"{request.prompt_tokens} is shorter than the "
                         f"continued request {name!r}: its prompt + output is {whole} tokens")
        return parent

    def _name(self, name: str, loc: str, line_no: int, request: Request) -> None:
        if name in self._named:
            first = loc.rsplit(":", 1)[0] + f":{self._named[name][1]}"
            raise F.fail(loc, "request_id", f"{name!r} is already used at {first}")
        self._named[name] = (request, line_no)


def _outputs(record: dict, loc: str, request: Request) -> None:
    ids = record.get("output_token_ids")
    if ids is None:
        return
    request.output_token_ids = F.token_ids(ids, "output_token_ids", loc)
    if len(request.output_token_ids) != request.output_tokens:
        raise F.fail(loc, "output_token_ids", f"{len(request.output_token_ids)} ids for "
                     f"{request.output_tokens} output tokens; give one per output token")
