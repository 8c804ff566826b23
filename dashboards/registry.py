"""The dashboards kvscope ships, in menu order."""

from kvscope.dashboards import efficiency, findings, fleet_overview, gpu_host, kv_cache, request_phases, tenants
from kvscope.dashboards.board import Board

BOARDS: tuple[Board, ...] = (
    fleet_overview.BOARD,
    kv_cache.BOARD,
    tenants.BOARD,
    request_phases.BOARD,
    gpu_host.BOARD,
    efficiency.BOARD,
    findings.BOARD,
)


def file_name(board: Board) -> str:
    """build/<uid without the kvscope- prefix>.json"""
    return board.uid.removeprefix("kvscope-") + ".json"
