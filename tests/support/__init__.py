"""Helpers shared by the test modules: models, call trees and subprocess runs.

Nothing here imports torch: the torch models are built by functions that are handed the
``torch`` module, so that core tests importing this package keep torch unimported.
"""
