"""The turn_kit version (the seed reads it from package.json)."""

TURN_KIT_VERSION = "0.1.0"
