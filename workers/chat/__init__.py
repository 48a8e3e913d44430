"""The chat pool: the chat queue read on the process loop, a chat run from its cache lookup to its
last chunk, failover between workers, and the usage rows it hands to the bulk pool."""
