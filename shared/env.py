"""The prefix of every firsttoken environment variable (``FIRSTTOKEN_<FIELD>``).

Its own module so that what the settings validate (the model table) can name a variable in its
errors without importing the settings.
"""

ENV_PREFIX = "FIRSTTOKEN_"
