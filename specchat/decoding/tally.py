"""The running totals of one answer (`Tally`), kept by the loop round by round and read by its
callers, partial ones included after an interrupt (the server's, the CLI's)."""

from __future__ import annotations

from dataclasses import dataclass, field

from .events import DrafterStats, Round, RouteStats, Stats


@dataclass(slots=True)
class Tally:
    """Running totals. Callers may pass their own to read partial stats after an interrupt."""

    prompt_tokens: int = 0
    prefill_tokens: int = 0
    generated: int = 0
    prefill_seconds: float = 0.0
    decode_seconds: float = 0.0
    drafted: int = 0
    accepted: int = 0
    passes: int = 0
    drafted_by_pos: list[int] = field(default_factory=list)
    accepted_by_pos: list[int] = field(default_factory=list)
    k_history: list[int] = field(default_factory=list)
    drafters: dict[str, DrafterStats] = field(default_factory=dict)
    rechecked: int = 0
    repaired: int = 0
    routes: dict[tuple[str, str | None], RouteStats] = field(default_factory=dict)

    def add_round(self, rnd: Round) -> None:
        self.passes += 1
        self.rechecked += rnd.recheck
        self.repaired += rnd.repaired
        self.drafted += rnd.drafted + rnd.side_nodes
        self.accepted += rnd.accepted + rnd.side_accepted
        self.k_history.append(rnd.k)
        while len(self.drafted_by_pos) < rnd.drafted:
            self.drafted_by_pos.append(0)
            self.accepted_by_pos.append(0)
        for i in range(rnd.drafted):
            self.drafted_by_pos[i] += 1
            self.accepted_by_pos[i] += i < rnd.accepted
        if rnd.drafter is not None:
            name, route = rnd.drafter, rnd.route
            one = DrafterStats(
                name, rounds=1, drafted=rnd.drafted, accepted=rnd.accepted, seconds=rnd.draft_seconds
            )
            self.drafters[name] = self.drafters.get(name, DrafterStats(name)) + one
            on_route = RouteStats(
                name, route, rounds=1, drafted=rnd.drafted, accepted=rnd.accepted, rechecked=int(rnd.recheck)
            )
            self.routes[name, route] = self.routes.get((name, route), RouteStats(name, route)) + on_route

    def snapshot(self, stop_reason: str) -> Stats:
        return Stats(
            prompt_tokens=self.prompt_tokens,
            prefill_tokens=self.prefill_tokens,
            generated_tokens=self.generated,
            prefill_seconds=self.prefill_seconds,
            decode_seconds=self.decode_seconds,
            drafted=self.drafted,
            accepted=self.accepted,
            target_passes=self.passes,
            stop_reason=stop_reason,
            accepted_by_position=tuple(self.accepted_by_pos),
            drafted_by_position=tuple(self.drafted_by_pos),
            drafters=tuple(self.drafters.values()),
            k_history=tuple(self.k_history),
            rechecked=self.rechecked,
            repaired=self.repaired,
            routes=tuple(self.routes.values()),
        )
