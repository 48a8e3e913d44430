"""The knowledge base: files -> chunks -> embeddings in the database -> per-tenant top-k search.

:mod:`chunking` and :mod:`files` are pure; :mod:`store` does the database I/O; :mod:`index`
holds the in-memory vectors a chat worker searches.
"""
