"""The microcontroller path: int8 graph IR, training compiler, host simulator, firmware driver."""
