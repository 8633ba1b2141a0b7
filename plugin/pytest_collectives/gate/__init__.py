"""The regression gate: the baseline store, the statistics, the plugin and its reports."""
