module nriplugin.local/kind/pause

go 1.25.0
