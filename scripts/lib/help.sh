# scripts/lib/help.sh — sourced by the bash scripts beside it: each one's
# --help is its header comment, so the help and the comment cannot differ.
#
#   answer_help "$0" "$@"   if an argument is -h or --help, print the
#                           script's header comment and exit 0
#   refuse_arg NAME ARG WHAT
#                           print "NAME: unknown argument 'ARG' (WHAT, or
#                           see --help)" to stderr and exit 2

# The comment from line 2 to the first line that is not one, without "# ".
script_help() { awk 'NR == 1 { next } /^#/ { sub(/^# ?/, ""); print; next } { exit }' "$1"; }

answer_help() {
  local script="$1" a
  shift
  for a in "$@"; do
    case "$a" in -h|--help) script_help "$script"; exit 0 ;; esac
  done
}

refuse_arg() {
  echo "$1: unknown argument '$2' ($3, or see --help)" >&2
  exit 2
}
