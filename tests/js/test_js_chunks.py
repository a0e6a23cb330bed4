"""A message in pieces between the unmodified JavaScript client and Python, both ways.

The hub delivers every ``message_cache.create`` as an overwrite (its walk of a
key starts there, so the receiver's cache must too): hypha-rpc's JavaScript
``_create_message(key, heartbeat, overwrite, context)`` takes it as the
Python client does, and a message above 256 KiB still arrives whole.
"""

from __future__ import annotations


async def test_a_message_in_pieces_reaches_the_javascript_client_and_comes_back(start_agent, server, connect):
    py = await connect(client_id="py")
    token = await py.generate_token()
    agent = await start_agent(server_url=server.url, token=token, workspace=py.config["workspace"], client_id="js")
    try:
        js = await py.get_service(agent.service_id)
        data = bytes(range(256)) * 3000  # 768,000 bytes: three pieces each way
        assert await js.echo(data) == data
    except BaseException:
        print(f"--- {agent.runtime} agent log ---\n{agent.log()}")
        raise
