"""The one Redis seam: every firsttoken process reaches Redis through these modules.

- ``address``: where and how to connect, read from the redis:// / rediss:// / unix:// URL
  (TLS, AUTH, SELECT, client name, connect timeout, Sentinels), and Celery's broker URL for it.
- ``sentinel``: which server is the master of a sentinel:// URL, asked of its Sentinels each
  time a connection opens (every client below goes through it).
- ``resp``: commands packed to RESP bytes; the hiredis reply parser with redis-py's error classes.
- ``connection``: one asyncio connection that writes packed commands and reads replies (the
  pipe, the chat queue's reads and the bench producer stand on it).
- ``pipe``: the pipelined writer for the commands on a chat's path (token chunks, admission).
- ``pubsub``: the subscriber connection that routes each channel's messages to its handler.
- ``client``: redis-py's client, for ordinary commands.
- ``scripts``: every Lua script, one ``.lua`` file each, and ``run`` (EVALSHA, loaded again on
  NOSCRIPT) for redis-py's client; the pipe and the chat queue's reads run the same objects.
"""
