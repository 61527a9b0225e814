-- acl-check-v1.lua: answers, for each probe, whether the calling ACL user may run it.
--
-- Run once per new connection, before the connection is used (adapter-redis `acl.rs`). It
-- runs nothing it probes: `redis.acl_check_cmd` (Redis >= 7.0) answers whether the current
-- user may run a command with those arguments, key patterns included, without running it.
-- Read only: no write, no TIME, no key touched.
--
-- KEYS: none. The probe keys travel in ARGV: a declared key would make Redis refuse the EVAL
-- itself (NOPERM) when the user's key pattern excludes it, before this program could say
-- which commands are affected.
-- ARGV: one or more probes, each as a count followed by that many arguments:
--   [i]       n        1..=32, decimal digits: the probe's argument count
--   [i+1..i+n]         the command (subcommand included, e.g. XINFO STREAM) and its
--                      arguments, with the probe key where the command takes a key, so that
--                      Redis finds the key where the real command has it.
--   `acl_check_cmd` does not check arity, but it reads keys at the positions the command's
--   key specs name, so every probe carries its full shape (SET key v PX 1, not SET key).
--
-- Reply: {status, verdicts}
--   ACL_CHECKED   verdicts = one bulk string per probe, in ARGV order:
--                   PERMITTED  the user may run it with these arguments
--                   DENIED     the command, its subcommand or the key is not permitted
--                   UNKNOWN    the server does not know the command (acl_check_cmd raised)
--                   ERROR      acl_check_cmd raised another error
--   UNSUPPORTED   the server has no redis.acl_check_cmd (Redis < 7.0); verdicts is empty
--   INVALID       ARGV is not a well-formed probe list; verdicts is empty

if type(redis.acl_check_cmd) ~= 'function' then
  return { 'UNSUPPORTED', {} }
end

local argv = ARGV
local verdicts = {}
local i = 1
while i <= #argv do
  local count = argv[i]
  if count == '' or string.find(count, '%D') or count + 0 < 1 or count + 0 > 32
    or i + count > #argv then
    return { 'INVALID', {} }
  end
  local n = count + 0
  local ok, permitted = pcall(redis.acl_check_cmd, unpack(argv, i + 1, i + n))
  if ok and permitted == true then
    verdicts[#verdicts + 1] = 'PERMITTED'
  elseif ok and permitted == false then
    verdicts[#verdicts + 1] = 'DENIED'
  elseif not ok and string.find(tostring(permitted), 'Invalid command', 1, true) then
    verdicts[#verdicts + 1] = 'UNKNOWN'
  else
    -- Neither a boolean nor the unknown-command error: never read as permitted.
    verdicts[#verdicts + 1] = 'ERROR'
  end
  i = i + n + 1
end
if #verdicts == 0 then
  return { 'INVALID', {} }
end
return { 'ACL_CHECKED', verdicts }
