# Progress lines for the install and build scripts (sourced; bash). A step that may take more
# than a few seconds says what it does when it starts, then every NRIPLUGIN_PROGRESS_EVERY
# seconds (default 15) how long it has taken and how far it is, and how long it took at the
# end: plain lines on stderr, no escape codes, so a terminal, a pipe and a CI log read alike.
#
#   progress_total 4                          # this run has 4 steps
#   progress_step 2 "downloading X" count_fn -- cmd args...
#       [2/4] downloading X...
#             still downloading X: 1m30s, step 2/4, 85 modules so far
#       [2/4] done in 1m41s
#
# COUNT_FN (or "") names a function that prints how far the step is ("412/1018 packages"). A
# script called by another can go on with its numbering: PROGRESS_FIRST (the steps done
# before) and PROGRESS_TOTAL, exported by the caller, win over progress_total. The ticker is a
# subshell of the script: it ends with the step, with a Ctrl-C, or within a second of the
# script if that was killed.

progress_every=${NRIPLUGIN_PROGRESS_EVERY:-15}
progress_first=${PROGRESS_FIRST:-0}
progress_of=${PROGRESS_TOTAL:-}

progress_total() {  # N: the steps of this script, when no caller set PROGRESS_TOTAL
  [ -n "${PROGRESS_TOTAL:-}" ] || progress_of=$1
}

progress_time() {  # SECONDS -> 45s, 1m30s
  local s=$1
  if [ "$s" -ge 60 ]; then printf '%dm%02ds' $((s / 60)) $((s % 60)); else printf '%ds' "$s"; fi
}

progress_say() {
  echo "$*" >&2
}

progress_step() {  # N WHAT COUNT_FN -- CMD...: runs CMD (its status is the step's); N "": no number
  local n=$1 what=$2 count=$3
  shift 4
  local at="" t0=$SECONDS rc=0 ticker
  [ -z "$n" ] || at="$((progress_first + n))/${progress_of:-?}"
  progress_say "${at:+[$at] }$what..."
  (
    # Ended by the step (TERM) or with the script (a terminal's INT, HUP: an asynchronous
    # command ignores INT unless it traps it); its one-second naps end with it.
    trap 'kill "$nap" 2>/dev/null; exit 0' TERM INT HUP
    parent=$$  # the script (a subshell's $$ is its shell's)
    last=$SECONDS
    while kill -0 "$parent" 2>/dev/null; do
      sleep 1 &
      nap=$!
      wait "$nap" || true
      [ $((SECONDS - last)) -ge "$progress_every" ] || continue
      last=$SECONDS
      far=
      [ -z "$count" ] || far=$("$count" 2>/dev/null || true)
      progress_say "      still $what: $(progress_time $((SECONDS - t0)))${at:+, step $at}${far:+, $far}"
    done
  ) >/dev/null &
  ticker=$!
  "$@" || rc=$?
  kill "$ticker" 2>/dev/null || true
  wait "$ticker" 2>/dev/null || true
  if [ "$rc" -eq 0 ] && [ -n "$at" ]; then
    progress_say "[$at] done in $(progress_time $((SECONDS - t0)))"
  elif [ "$rc" -eq 0 ]; then
    progress_say "$what: done in $(progress_time $((SECONDS - t0)))"
  else
    progress_say "${at:+[$at] }$what failed (status $rc) after $(progress_time $((SECONDS - t0)))"
  fi
  return "$rc"
}
