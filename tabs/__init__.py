"""The app's tabs: widgets plus a few short handlers each. Never imports torch or model libraries."""
