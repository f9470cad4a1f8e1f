// Rampart's bridge to JShell (the JDK's `jdk.jshell` API), driven by java_kernel.py.
//
// Compiled by java_kernel.py at its first start (once per user, into ~/.cache), or run by the
// JDK's source launcher (`java JShellBridge.java`) where there is no javac.
// It keeps one JShell whose snippets run in a separate JVM (JShell's default execution
// engine), and speaks a line protocol on stdin/stdout, every field base64 (UTF-8):
//
//   in:  EVAL <code>          evaluates the snippets of <code> in order, stops at the first
//                             that fails
//        ENV <name> <value>   sets an environment variable in the snippets' JVM (System.getenv,
//                             and System.getProperty as E2B's kernel has it)
//        UNSET <name>         removes one (both)
//        STOP                 stops the running evaluation (an interrupt)
//   out: OUT <text> / ERR <text>          the snippets' System.out / System.err, as written
//        VALUE <text> <type>              the value of the last snippet, if an expression
//        EXC <class> <message> <trace>    a snippet threw
//        DIAG <message>                   a snippet did not compile
//        DONE                             the end of one EVAL, ENV or UNSET
//        READY                            once, when JShell answers
import java.io.BufferedReader;
import java.io.InputStreamReader;
import java.io.OutputStream;
import java.io.PrintStream;
import java.nio.charset.StandardCharsets;
import java.util.Base64;
import java.util.List;
import java.util.Locale;
import java.util.concurrent.LinkedBlockingQueue;
import java.util.stream.Collectors;
import jdk.jshell.Diag;
import jdk.jshell.EvalException;
import jdk.jshell.JShell;
import jdk.jshell.Snippet;
import jdk.jshell.SnippetEvent;
import jdk.jshell.SourceCodeAnalysis;
import jdk.jshell.UnresolvedReferenceException;
import jdk.jshell.VarSnippet;

public class JShellBridge {
    private static final PrintStream OUT =
            new PrintStream(new java.io.FileOutputStream(java.io.FileDescriptor.out), true, StandardCharsets.UTF_8);

    private static String b64(String s) {
        return Base64.getEncoder().encodeToString((s == null ? "" : s).getBytes(StandardCharsets.UTF_8));
    }

    private static String unb64(String s) {
        return new String(Base64.getDecoder().decode(s), StandardCharsets.UTF_8);
    }

    private static void send(String kind, String... fields) {
        StringBuilder b = new StringBuilder(kind);
        for (String f : fields) {
            b.append(' ').append(b64(f));
        }
        synchronized (OUT) {
            OUT.println(b);
            OUT.flush();
        }
    }

    /** A stream that sends what is written to it as OUT or ERR lines. */
    private static final class Relay extends OutputStream {
        private final String kind;

        Relay(String kind) {
            this.kind = kind;
        }

        @Override
        public void write(int b) {
            write(new byte[] {(byte) b}, 0, 1);
        }

        @Override
        public void write(byte[] b, int off, int len) {
            if (len > 0) {
                send(kind, new String(b, off, len, StandardCharsets.UTF_8));
            }
        }
    }

    /** The text of a Java string literal as JShell shows a String value. */
    static String unquote(String v) {
        if (v == null || v.length() < 2 || v.charAt(0) != '"' || v.charAt(v.length() - 1) != '"') {
            return v;
        }
        StringBuilder b = new StringBuilder();
        for (int i = 1; i < v.length() - 1; i++) {
            char c = v.charAt(i);
            if (c != '\\' || i + 1 >= v.length() - 1) {
                b.append(c);
                continue;
            }
            char n = v.charAt(++i);
            switch (n) {
                case 'n': b.append('\n'); break;
                case 't': b.append('\t'); break;
                case 'r': b.append('\r'); break;
                case 'b': b.append('\b'); break;
                case 'f': b.append('\f'); break;
                case '0': b.append('\0'); break;
                case 'u':
                    if (i + 4 < v.length()) {
                        b.append((char) Integer.parseInt(v.substring(i + 1, i + 5), 16));
                        i += 4;
                    }
                    break;
                default: b.append(n);
            }
        }
        return b.toString();
    }

    private static String trace(Throwable t) {
        StringBuilder b = new StringBuilder();
        for (StackTraceElement e : t.getStackTrace()) {
            b.append("\tat ").append(e).append('\n');
        }
        return b.toString();
    }

    private static JShell shell;

    /** Evaluates `code` snippet by snippet; false once one failed. */
    private static void eval(String code) {
        SourceCodeAnalysis sca = shell.sourceCodeAnalysis();
        String rest = code;
        SnippetEvent last = null;
        while (!rest.isBlank()) {
            SourceCodeAnalysis.CompletionInfo ci = sca.analyzeCompletion(rest);
            String src;
            if (ci.completeness() == SourceCodeAnalysis.Completeness.DEFINITELY_INCOMPLETE
                    || ci.completeness() == SourceCodeAnalysis.Completeness.EMPTY
                    || ci.source() == null) {
                src = rest;
                rest = "";
            } else {
                src = ci.source();
                rest = ci.remaining();
            }
            if (src.isBlank()) {
                continue;
            }
            List<SnippetEvent> events = shell.eval(src);
            for (SnippetEvent ev : events) {
                if (ev.causeSnippet() != null) {
                    continue; // an update of a dependent snippet
                }
                if (ev.status() == Snippet.Status.REJECTED) {
                    String diags = shell.diagnostics(ev.snippet())
                            .map(d -> describe(d, ev.snippet().source()))
                            .collect(Collectors.joining("\n"));
                    send("DIAG", diags.isEmpty() ? "the snippet was rejected: " + src.strip() : diags);
                    return;
                }
                Exception ex = ev.exception();
                if (ex instanceof EvalException) {
                    EvalException e = (EvalException) ex;
                    send("EXC", e.getExceptionClassName(), e.getMessage() == null ? "" : e.getMessage(),
                            e.getExceptionClassName() + (e.getMessage() == null ? "" : ": " + e.getMessage())
                                    + "\n" + trace(e));
                    return;
                }
                if (ex instanceof UnresolvedReferenceException) {
                    UnresolvedReferenceException u = (UnresolvedReferenceException) ex;
                    String msg = "unresolved reference in " + u.getSnippet().source().strip();
                    send("EXC", "UnresolvedReferenceException", msg, msg);
                    return;
                }
                if (ex != null) {
                    send("EXC", ex.getClass().getName(), String.valueOf(ex.getMessage()),
                            ex + "\n" + trace(ex));
                    return;
                }
                last = ev;
            }
        }
        if (last == null || last.value() == null) {
            return;
        }
        Snippet s = last.snippet();
        boolean expression = s.kind() == Snippet.Kind.EXPRESSION
                || (s.kind() == Snippet.Kind.VAR && s.subKind() == Snippet.SubKind.TEMP_VAR_EXPRESSION_SUBKIND);
        if (!expression) {
            return;
        }
        String type = s instanceof VarSnippet ? ((VarSnippet) s).typeName() : "";
        if (s instanceof jdk.jshell.ExpressionSnippet) {
            type = ((jdk.jshell.ExpressionSnippet) s).typeName();
        }
        String value = last.value();
        if ("String".equals(type) || "java.lang.String".equals(type)) {
            value = unquote(value);
        }
        if ("void".equals(type)) {
            return;
        }
        send("VALUE", value, type);
    }

    private static String describe(Diag d, String src) {
        String msg = d.getMessage(Locale.ROOT);
        long pos = d.getPosition();
        if (pos >= 0 && pos <= src.length()) {
            int line = 1;
            for (int i = 0; i < pos; i++) {
                if (src.charAt(i) == '\n') {
                    line++;
                }
            }
            return "line " + line + ": " + msg;
        }
        return msg;
    }

    private static String javaString(String s) {
        StringBuilder b = new StringBuilder("\"");
        for (char c : s.toCharArray()) {
            if (c == '"' || c == '\\') {
                b.append('\\').append(c);
            } else if (c < 0x20 || c > 0x7e) {
                b.append(String.format("\\u%04x", (int) c));
            } else {
                b.append(c);
            }
        }
        return b.append('"').toString();
    }

    /**
     * Sets (value non-null) or removes a variable of the snippets' JVM: in its System.getenv()
     * and, as E2B's Java kernel has them, as a system property (System.getProperty).
     */
    private static void env(String name, String value) {
        String op = value == null
                ? "__m.remove(" + javaString(name) + "); System.clearProperty(" + javaString(name) + ");"
                : "__m.put(" + javaString(name) + ", " + javaString(value) + "); System.setProperty("
                        + javaString(name) + ", " + javaString(value) + ");";
        String code = "{ java.util.Map<String, String> __e = System.getenv();"
                + " java.lang.reflect.Field __f = __e.getClass().getDeclaredField(\"m\");"
                + " __f.setAccessible(true);"
                + " @SuppressWarnings(\"unchecked\") java.util.Map<String, String> __m ="
                + " (java.util.Map<String, String>) __f.get(__e); " + op + " }";
        for (SnippetEvent ev : shell.eval(code)) {
            if (ev.status() == Snippet.Status.REJECTED || ev.exception() != null) {
                send("ERR", "setting " + name + " in the JVM failed\n");
            }
            shell.drop(ev.snippet());
        }
    }

    public static void main(String[] args) throws Exception {
        shell = JShell.builder()
                .out(new PrintStream(new Relay("OUT"), true, StandardCharsets.UTF_8))
                .err(new PrintStream(new Relay("ERR"), true, StandardCharsets.UTF_8))
                .remoteVMOptions("--add-opens", "java.base/java.util=ALL-UNNAMED",
                        "-XX:+UseSerialGC", "-Xshare:auto",
                        "-Duser.dir=" + System.getProperty("user.dir"))
                .build();
        // The environment (the sandbox's variables among it) as system properties too, as E2B's
        // Java kernel gives them (System.getProperty("NAME")); a property the JVM already has
        // (java.*, user.*, ...) is left alone.
        for (SnippetEvent ev : shell.eval("System.getenv().forEach((__k, __v) -> {"
                + " if (System.getProperty(__k) == null) System.setProperty(__k, __v); });")) {
            shell.drop(ev.snippet());
        }
        // JShell's usual start: the imports its console has.
        for (String imp : new String[] {"java.io.*", "java.math.*", "java.net.*", "java.nio.file.*",
                "java.util.*", "java.util.concurrent.*", "java.util.function.*", "java.util.prefs.*",
                "java.util.regex.*", "java.util.stream.*"}) {
            shell.eval("import " + imp + ";");
        }
        LinkedBlockingQueue<String[]> work = new LinkedBlockingQueue<>();
        Thread worker = new Thread(() -> {
            while (true) {
                String[] job;
                try {
                    job = work.take();
                } catch (InterruptedException e) {
                    return;
                }
                try {
                    switch (job[0]) {
                        case "EVAL": eval(job[1]); break;
                        case "ENV": env(job[1], job[2]); break;
                        case "UNSET": env(job[1], null); break;
                        default: break;
                    }
                } catch (RuntimeException e) {
                    send("EXC", e.getClass().getName(), String.valueOf(e.getMessage()), e + "\n" + trace(e));
                }
                send("DONE");
            }
        }, "eval");
        worker.setDaemon(true);
        worker.start();
        send("READY");
        BufferedReader in = new BufferedReader(new InputStreamReader(System.in, StandardCharsets.UTF_8));
        String line;
        while ((line = in.readLine()) != null) {
            String[] p = line.split(" ", -1);
            switch (p[0]) {
                case "STOP":
                    shell.stop();
                    break;
                case "EVAL":
                    work.put(new String[] {"EVAL", unb64(p[1])});
                    break;
                case "ENV":
                    work.put(new String[] {"ENV", unb64(p[1]), unb64(p[2])});
                    break;
                case "UNSET":
                    work.put(new String[] {"UNSET", unb64(p[1])});
                    break;
                default:
                    break;
            }
        }
        shell.close();
        System.exit(0);
    }
}
