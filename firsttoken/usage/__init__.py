"""The analysts' queries behind `firsttoken usage`: grouped reports over the usage rows."""
