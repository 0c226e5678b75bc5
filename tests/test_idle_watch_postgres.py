"""Idle AsyncOwners on PostgreSQL: the shared watch looks for them when the store hints (NOTIFY),
so an idle owner is woken by another writer's steer at once, with no polling, and learns of a
takeover of its lease from the store's renewal, with no send to be refused."""

from __future__ import annotations

import asyncio

from nous_inbox.errors import LeaseLostError
from nous_inbox.owner.async_owner import AsyncOwner
from nous_inbox.runner import Runner
from nous_inbox.store import open_store
from tests import postgres_server
from tests.helpers import async_wait_until
from tests.test_idle_watch import echo, steer_from_elsewhere

postgres_server.require_psycopg()  # skipped without psycopg, failed in CI; then imported:

from tests.test_store_postgres import sql  # noqa: E402


def test_an_idle_async_owner_is_woken_by_the_notification_of_another_writers_steer(
        postgres_url: str) -> None:
    url = f"{postgres_url}&poll=3600"  # the backstop would take an hour: only NOTIFY can wake it
    with open_store(url) as store, open_store(url) as elsewhere:

        async def main() -> None:
            async with AsyncOwner(store, "s", Runner(echo), poll_interval=3600) as owner:
                steer_from_elsewhere(elsewhere, "s", "wake up")
                await async_wait_until(lambda: len(owner.transcript) == 2, what="the idle owner answered")
                assert [m.content for m in owner.transcript] == ["wake up", "heard: wake up"]

        asyncio.run(main())


def test_an_idle_async_owner_learns_of_a_takeover_from_its_lease_renewal(
        postgres_url: str) -> None:
    with open_store(f"{postgres_url}&lease=0.6&poll=0.05") as store:

        async def main() -> None:
            async with AsyncOwner(store, "s", Runner(echo), start=False) as owner:
                await asyncio.to_thread(
                    sql, postgres_url, "UPDATE \"SCHEMA\".nous_inbox_streams SET holder = "
                    "'someone else', epoch = epoch + 1 WHERE stream = %s", "s")
                await async_wait_until(lambda: owner.lost is not None, what="the idle owner heard of it")
                assert isinstance(owner.lost, LeaseLostError)  # with no send to be refused
                assert owner.closed

        asyncio.run(main())
