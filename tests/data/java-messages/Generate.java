// Writes the seed-001 timeout bean as real Java JSON libraries do, byte-exact, into the files
// beside this one. Run by hand (see README.md); the output is committed, not regenerated in CI.
//
//   javac -cp "$CP" Generate.java && java -cp "$CP:." -Duser.timezone=UTC Generate
//   CP=/usr/share/java/jackson-databind.jar:/usr/share/java/jackson-core.jar:\
//      /usr/share/java/jackson-annotations.jar:/usr/share/java/gson.jar
import com.fasterxml.jackson.core.json.JsonWriteFeature;
import com.fasterxml.jackson.databind.ObjectMapper;
import com.fasterxml.jackson.databind.SerializationFeature;
import com.fasterxml.jackson.databind.json.JsonMapper;
import com.google.gson.Gson;
import java.nio.charset.StandardCharsets;
import java.nio.file.Files;
import java.nio.file.Path;
import java.util.Date;

public class Generate {
    /** Seed 001's bean: ids and createTime as Long. */
    public static class OrderTimeoutMessage {
        public Long orderId;
        public Long activityId;
        public Long userId;
        public Long createTime;
        public Integer phase;
        OrderTimeoutMessage(long orderId) {
            this.orderId = orderId;
            this.activityId = 77L;
            this.userId = 9001L;
            this.createTime = 1767225600000L; // 2026-01-01T00:00:00Z
            this.phase = 0;
        }
    }

    /** The same bean where an order service keeps createTime as a java.util.Date. */
    public static class DatedTimeoutMessage {
        public Long orderId;
        public Long activityId;
        public Long userId;
        public Date createTime;
        public Integer phase;
        DatedTimeoutMessage(long orderId) {
            this.orderId = orderId;
            this.activityId = 77L;
            this.userId = 9001L;
            this.createTime = new Date(1767225600000L);
            this.phase = 0;
        }
    }

    static void write(String name, String json) throws Exception {
        Files.write(Path.of(name), json.getBytes(StandardCharsets.UTF_8));
    }

    public static void main(String[] args) throws Exception {
        java.util.Locale.setDefault(java.util.Locale.US);
        ObjectMapper jackson = new ObjectMapper();
        write("jackson-2.14-default.json", jackson.writeValueAsString(new OrderTimeoutMessage(1790000000000000123L)));
        ObjectMapper asStrings = JsonMapper.builder().enable(JsonWriteFeature.WRITE_NUMBERS_AS_STRINGS).build();
        write("jackson-2.14-numbers-as-strings.json", asStrings.writeValueAsString(new OrderTimeoutMessage(1790000000000000124L)));
        ObjectMapper isoDates = new ObjectMapper().disable(SerializationFeature.WRITE_DATES_AS_TIMESTAMPS);
        write("jackson-2.14-iso-dates.json", isoDates.writeValueAsString(new DatedTimeoutMessage(1790000000000000125L)));
        write("gson-2.10-default.json", new Gson().toJson(new OrderTimeoutMessage(1790000000000000126L)));
        write("gson-2.10-date.json", new Gson().toJson(new DatedTimeoutMessage(1790000000000000127L)));
        // Refused: a JavaScript-side or float-typed writer's exponent form of an id.
        write("refused-exponent-id.json", "{\"orderId\":1.79e18,\"activityId\":77,\"userId\":9001,\"createTime\":1767225600000,\"phase\":0}");
    }
}
